"""The upstream checks: does vLLM's sharder still match the spec? Its fields read from the code (drift.py), or
its behaviour run and judged rule by rule (behaviour.py, verdicts.py), from the file read by source.py."""
