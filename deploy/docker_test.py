#!/usr/bin/python3
"""Lints deploy/docker/Dockerfile without a container engine.

CI has no docker or podman, so the image is never built here. What we can
check, we do against the real repository and the real binaries:
  - the stages: a build stage that runs ./bazelw, a slim runtime stage,
    COPY --from naming earlier stages, context paths that exist;
  - the Bazel targets it builds are the binaries this test depends on
    (argv), and what it copies out of bazel-bin is what it built;
  - the runtime stage runs as a fixed non-root uid, its entrypoint is the
    copied server, and every flag it passes is a flag the server has;
  - the runtime stage installs the Debian package of every shared library
    the built binaries link (ldd + dpkg -S), so the image can start them;
  - the `docker run` examples (the header's and docs/operations.md's)
    create the host directory they bind-mount owned by the image's uid and
    gid first, since the daemon cannot create its socket in a root-owned
    one;
  - with .git outside the build context, the build stage takes the commit
    as the PAGEALLOC_COMMIT build argument.
Usage: docker_test.py SERVER_BINARY CLI_BINARY
"""

import os
import re
import shlex
import subprocess
import sys

DOCKERFILE = "deploy/docker/Dockerfile"
OPERATIONS = "docs/operations.md"
# Packages every debian:12-slim image has (Priority: required).
BASE_PACKAGES = {"libc6", "libgcc-s1", "libstdc++6", "zlib1g"}

failures = []


def check(condition, message):
    if not condition:
        failures.append(message)


def instructions(text):
    """Yields (KEYWORD, arguments) with continuations joined."""
    logical = ""
    for line in text.splitlines():
        if not logical and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        logical += line
        keyword, _, args = logical.strip().partition(" ")
        yield keyword.upper(), args.strip()
        logical = ""


def stages(text):
    """Returns [{name, base, body: [(KEYWORD, args)]}] in order."""
    result = []
    for keyword, args in instructions(text):
        if keyword == "FROM":
            words = args.split()
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            result.append({"name": name, "base": words[0], "body": []})
        elif result:
            result[-1]["body"].append((keyword, args))
    return result


def linked_packages(binary):
    """Debian packages of the shared libraries `binary` links."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True,
                         check=True).stdout
    packages = set()
    for path in re.findall(r"=> (/\S+)", out):
        # Debian 12 is merged-/usr: ldd says /lib, dpkg may record /usr/lib.
        for candidate in (path, "/usr" + path, os.path.realpath(path)):
            found = subprocess.run(["dpkg", "-S", candidate],
                                   capture_output=True, text=True)
            if found.returncode == 0:
                packages.add(found.stdout.split(":")[0])
                break
        else:
            failures.append(f"no Debian package owns {path} ({binary})")
    return packages


def server_flags(server):
    out = subprocess.run([server, "--helpfull"], capture_output=True,
                         text=True).stdout
    return set(re.findall(r"^\s+--([a-z_]+) \(", out, re.M))


def text_header(text):
    """The Dockerfile's leading comment, without the comment marks."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:])
    return "\n".join(lines)


def check_socket_directory(name, text, uid, gid):
    """Each `docker run -v HOST:...` in `text` follows an install -d of HOST
    owned by uid:gid."""
    joined = text.replace("\\\n", " ")
    runs = [line for line in joined.splitlines() if "docker run" in line]
    check(runs, f"{name}: no docker run example")
    for run in runs:
        for host in re.findall(r"-v\s+(/[^:\s]+):", run):
            before = joined[:joined.index(run)]
            pattern = (r"install -d -o %s -g %s(?: -m \d+)? %s\b"
                       % (uid, gid, re.escape(host)))
            check(re.search(pattern, before),
                  f"{name}: docker run mounts {host}, but nothing creates it "
                  f"owned by {uid}:{gid} (the image's USER) first")


def main():
    server, cli = sys.argv[1], sys.argv[2]
    # The runfile is a symlink into the source tree: its target's directory
    # is the repository the Dockerfile's build context is.
    repo = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.realpath(DOCKERFILE))))
    text = open(DOCKERFILE).read()
    all_stages = stages(text)
    check(len(all_stages) >= 2, "want a build stage and a runtime stage")
    names = [s["name"] for s in all_stages]
    build = next((s for s in all_stages if any(
        k == "RUN" and "./bazelw build" in a for k, a in s["body"])), None)
    check(build is not None, "no stage runs ./bazelw build")
    check(build is not None and build["base"] == "debian:12",
          "bazelw's packages are Debian 12's: build on debian:12")
    runtime = all_stages[-1]
    check(runtime["base"] == "debian:12-slim",
          f"runtime stage base {runtime['base']}, want debian:12-slim")

    # COPY sources: earlier stages, or paths of the build context.
    for index, stage in enumerate(all_stages):
        for keyword, args in stage["body"]:
            if keyword not in ("COPY", "ADD"):
                continue
            words = args.split()
            from_stage = [w.split("=", 1)[1] for w in words
                          if w.startswith("--from=")]
            sources = [w for w in words if not w.startswith("--")][:-1]
            if from_stage:
                check(from_stage[0] in names[:index],
                      f"COPY --from={from_stage[0]}: no earlier stage")
            elif keyword == "COPY":
                for source in sources:
                    check(os.path.exists(os.path.join(repo, source)),
                          f"COPY {source}: not in the repository")

    # Targets built, and what is taken out of bazel-bin.
    run_build = " ".join(a for k, a in build["body"] if k == "RUN") if build else ""
    targets = re.findall(r"//([\w/]+):([\w-]+)", run_build)
    built = {f"{pkg}/{name}" for pkg, name in targets}
    check(built == {"server/pagealloc-server", "client/pagealloc-cli"},
          f"Dockerfile builds {sorted(built)}; this test checks the server "
          "and the CLI (add new binaries to its data and argv)")
    for pkg, name in targets:
        build_file = open(os.path.join(repo, pkg, "BUILD.bazel")).read()
        check(re.search(r'name = "%s"' % re.escape(name), build_file),
              f"//{pkg}:{name} is not defined in {pkg}/BUILD.bazel")
    for path in re.findall(r"bazel-bin/(\S+)", run_build):
        check(path in built, f"copies bazel-bin/{path}, which it did not build")

    # Runtime stage: non-root user, entrypoint, flags, libraries.
    body = runtime["body"]
    users = [a for k, a in body if k == "USER"]
    check(users, "runtime stage sets no USER: it would run as root")
    if users:
        uid = users[-1].split(":")[0]
        check(uid not in ("0", "root"), f"USER {users[-1]} is root")
        check(any(f"--uid {uid}" in a for k, a in body if k == "RUN"),
              f"USER {uid}: no useradd --uid {uid} in the runtime stage")
    entry = [a for k, a in body if k == "ENTRYPOINT"]
    cmd = [a for k, a in body if k == "CMD"]
    argv = (eval(entry[-1]) if entry else []) + (eval(cmd[-1]) if cmd else [])
    check(argv and argv[0] == "/usr/local/bin/pagealloc-server",
          f"entrypoint {argv}")
    check(any(k == "COPY" and "--from=" in a and "/out/pagealloc-server" in a
              for k, a in body), "the runtime stage does not copy the server")
    flags = server_flags(server)
    check("metrics_port" in flags, f"--helpfull parsing found {flags}")
    for arg in argv[1:]:
        name = arg[2:].split("=")[0]
        check(name in flags, f"entrypoint flag --{name} is not a server flag")
    check("--metrics_host=0.0.0.0" in argv,
          f"entrypoint {argv} leaves metrics on loopback, out of reach of "
          "EXPOSE")
    exposed = [a for k, a in body if k == "EXPOSE"]
    check(exposed == ["9464"], f"EXPOSE {exposed}, want the metrics port 9464")

    installed = set()
    for keyword, args in body:
        if keyword == "RUN" and "apt-get install" in args:
            installed.update(w for w in shlex.split(args.split(
                "apt-get install", 1)[1].split("&&")[0])
                if not w.startswith("-"))
    # Sanitizer runtimes appear only when the suite itself runs under
    # --config=asan; the image is built without sanitizers.
    sanitizer_runtimes = {p for p in linked_packages(server) |
                          linked_packages(cli)
                          if re.match(r"lib(asan|ubsan|tsan|lsan)\d|"
                                      r"libclang-rt-", p)}
    needed = ((linked_packages(server) | linked_packages(cli)) -
              BASE_PACKAGES - sanitizer_runtimes)
    check(needed, "ldd found no Debian libraries: the check is broken")
    missing = needed - installed
    check(not missing, f"runtime stage lacks {sorted(missing)}; the binaries "
          "link them")

    ignore = open(DOCKERFILE + ".dockerignore").read().split()
    check("bazel-*" in ignore, "Bazel's output symlinks would enter the context")
    if ".git" in ignore and build is not None:
        check(any(k == "ARG" and a.split("=")[0] == "PAGEALLOC_COMMIT"
                  for k, a in build["body"]),
              "no .git in the context and no ARG PAGEALLOC_COMMIT: "
              "--version would say commit unknown")

    # The docker run examples: the bind-mounted socket directory must be
    # created for the image's user first.
    if users:
        uid, _, gid = users[-1].partition(":")
        for name, text in (("Dockerfile header", text_header(text)),
                           (OPERATIONS,
                            open(os.path.join(repo, OPERATIONS)).read())):
            check_socket_directory(name, text, uid, gid or uid)

    for failure in failures:
        print("FAIL:", failure)
    if failures:
        return 1
    print(f"OK: {len(all_stages)} stages; runtime installs {sorted(needed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
