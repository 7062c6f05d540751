"""What is checked: verdicts from what the ranks sent; imports nothing of an implementation under test."""
