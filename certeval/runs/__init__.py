"""One live run: its plan (a request validated before Ray or Prefect start), inputs, the state between rounds, the Prefect steps of each round, what it shows while it works."""
