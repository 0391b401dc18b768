"""The base layer: errors, records, exact integers, argument checks, the C core's
declarations (_core.pxd and the kernels' parameter blocks) and the lifetime words.
It imports nothing of metrale's above it.

docs/architecture.md maps the packages.
"""
