"""The store: tuning records and cost models per (hardware, target kind, realised budget), and moving
them between stores."""
