"""An implementation module whose import fails."""

raise ImportError("this module cannot be imported")
