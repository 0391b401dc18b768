"""The command line: ``metrale plan`` and ``metrale fit``.

docs/architecture.md maps the packages.
"""
