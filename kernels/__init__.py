"""CuTe DSL kernels for Hopper (sm_90a): GEMM mainloop, tile scheduler, epilogues."""
