"""The backends layer: memory and devices.  The backend interface and the host
backend, the CUDA backend with its kernels and physical mappings, pinned
staging, host scratch and the fault-injecting backends of metrale.testing.

docs/architecture.md maps the packages.
"""
