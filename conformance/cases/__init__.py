"""What is run: generated and multi-step cases, their limits, the reference's expectations, shrinking."""
