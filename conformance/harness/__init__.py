"""How ranks run: the groups that run an implementation's ranks, and what they send back."""
