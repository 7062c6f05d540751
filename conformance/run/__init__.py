"""The run: its options, its configuration and cases, the session that runs them and says how to reproduce each."""
