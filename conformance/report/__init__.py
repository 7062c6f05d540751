"""What is written: the terminal table, JSON and JUnit verdicts, the HTML report."""
