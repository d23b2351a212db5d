"""Applications built on scalefree's collectives (each with a Python entry point and a
``scalefree`` subcommand or bench)."""
