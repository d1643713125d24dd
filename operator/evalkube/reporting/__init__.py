"""What a person reads of a run: ``evalkube runs``, ``samples`` (views and exports), ``report``."""
