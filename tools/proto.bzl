"""cc_grpc_codegen: C++ protobuf messages and gRPC stubs from one .proto.

Runs Debian's /usr/bin/protoc with /usr/bin/grpc_cpp_plugin in a genrule (we
build offline, without the protobuf or gRPC Bazel rules) and wraps the output
in a cc_library. Generated code is compiled without our -Werror.
"""

load("//tools:copts.bzl", "GENERATED_COPTS")

def cc_grpc_codegen(name, src, visibility = None):
    stem = src[:-len(".proto")]
    outs = [stem + ext for ext in [".pb.h", ".pb.cc", ".grpc.pb.h", ".grpc.pb.cc"]]
    native.genrule(
        name = name + "_gen",
        srcs = [src],
        outs = outs,
        cmd = " ".join([
            "protoc",
            "--proto_path=.",
            "--cpp_out=$(GENDIR)",
            "--grpc_out=$(GENDIR)",
            "--plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin",
            "$(location {})".format(src),
        ]),
    )
    native.cc_library(
        name = name,
        srcs = [stem + ".pb.cc", stem + ".grpc.pb.cc"],
        hdrs = [stem + ".pb.h", stem + ".grpc.pb.h"],
        copts = GENERATED_COPTS,
        visibility = visibility,
        deps = [
            "@com_github_grpc_grpc//:grpc++",
            "@com_google_protobuf//:protobuf",
        ],
    )
