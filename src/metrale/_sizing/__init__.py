"""The sizing layer: model configs and the Hugging Face parser, the formula
language (formulas), buffer sets and the reference table, the sizes, the MoE
and decode-metadata layouts, the catalogue and the slab plan.  Pure Python
but for the slab plan (_layout, over the C core); no device.

docs/architecture.md maps the packages.
"""
