"""The sharing layer: what tensor parallelism needs below the arena: the
peers' mapped slabs and the descriptor exchange between ranks.

docs/architecture.md maps the packages.
"""
