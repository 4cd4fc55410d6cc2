"""Compiler flags for pagealloc's own code (never for generated code)."""

PAGEALLOC_COPTS = [
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wno-sign-compare",
    "-Wno-unused-parameter",
]

# For targets built from protoc / grpc_cpp_plugin output: their code is not
# ours to keep warning-free.
GENERATED_COPTS = ["-w"]
