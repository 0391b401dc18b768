# metrale._backends._transfer: CudaBackend binds upload, download and synchronize from here
# (typed in cuda.pyi).
