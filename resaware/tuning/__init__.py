"""Tuning: MetaSchedule's search under a budget, candidates built and measured where the budget is
realised (this machine, concurrent clients, RPC servers, a GPU elsewhere), and warm starts."""
