"""cuda_library: compiles .cu files with nvcc ahead of time into a cc_library.

We have no network for rules_cuda, so each .cu becomes one genrule that runs
nvcc -c into a position-independent object, and a cc_library links the
objects with the static CUDA runtime. Code is built for Hopper as sm_90
machine code plus compute_90 PTX (so a newer GPU can still load it); nothing
is compiled at run time.
"""

load("@local_cuda//:defs.bzl", "CUDA_AVAILABLE", "NVCC")

CUDA_GENCODE = [
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

def cuda_incompatible():
    """target_compatible_with for targets that need the CUDA toolkit."""
    return [] if CUDA_AVAILABLE else ["@platforms//:incompatible"]

def cuda_library(name, srcs, hdrs = [], deps = [], cuda_hdrs = [], nvcc_opts = [], visibility = None, **kwargs):
    """A cc_library built from .cu sources.

    Args:
      name: the cc_library's name.
      srcs: .cu files, each compiled by nvcc into one object.
      hdrs: public host headers of the library.
      deps: cc_library dependencies (their headers must be plain C++).
      cuda_hdrs: private headers (.cuh, .h) the .cu files include.
      nvcc_opts: extra nvcc flags.
      visibility: as usual.
      **kwargs: passed to the cc_library.
    """
    objs = []
    for src in srcs:
        stem = src.rsplit(".", 1)[0].replace("/", "_")
        obj = "_objs_cuda/{}/{}.o".format(name, stem)
        objs.append(obj)
        native.genrule(
            name = "{}_{}_nvcc".format(name, stem),
            srcs = [src] + hdrs + cuda_hdrs,
            outs = [obj],
            cmd = " ".join([
                NVCC,
                "-c",
                "-std=c++17",
                "-O3",
                "-Xcompiler",
                "-fPIC",
                "-Xcompiler",
                "-Wall",
                "--Werror",
                "all-warnings",
                "-I.",
                "-I$(GENDIR)",
            ] + CUDA_GENCODE + nvcc_opts + [
                "$(location {})".format(src),
                "-o",
                "$@",
            ]),
            target_compatible_with = cuda_incompatible(),
            tags = ["cuda"],
            visibility = ["//visibility:private"],
        )
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cuda_runtime"],
        target_compatible_with = cuda_incompatible(),
        visibility = visibility,
        **kwargs
    )
