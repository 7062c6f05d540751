"""The shardspec conformance suite: checks any implementation against the spec."""
