"""Deploying: compiling a model for the share it will run with from the store (never tuning), and
predicting, without measuring, how each stored budget's schedules run at another share."""
