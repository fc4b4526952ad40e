"""Our Triton kernels and the `triton` backend.

    common   the pieces the kernels share: targets, chunk and state-pass helpers, Layout, launch options, the named
             constexpr codes
    rla      RLA's fused kernels (`rla_triton`)
    rdn      RDN's base recurrence read twice in one pass (`delta_two_reads`)
    glue     the composition's elementwise glue, fused (`TRITON_GLUE`)
    backend  the `triton` backend: which of these runs for which inputs, and its registration

Each module imports triton; `rla_ablate.ops` imports `backend` only where triton and FLA are installed.
"""
