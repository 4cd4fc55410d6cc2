"""The ctypes structs of pagealloc/_native.py against the C ABI's header as
the compiler lays it out (python/layout_probe_gen.py's probe): every struct
the header defines has its ctypes twin, with the same fields in the same
order at the same offsets and sizes. A field added to one and not the other,
or a type that changes a size, fails here instead of corrupting memory."""

import ctypes
import json
import os
import subprocess

import pytest

from pagealloc import _native


def _probe_layouts():
    runfiles = os.path.join(os.environ["TEST_SRCDIR"],
                            os.environ["TEST_WORKSPACE"])
    probe = os.path.join(runfiles, "python", "native_layout_probe")
    output = subprocess.run([probe], check=True, capture_output=True,
                            text=True).stdout
    return [json.loads(line) for line in output.splitlines()]


LAYOUTS = _probe_layouts()


def _ctypes_name(c_name):
    """pagealloc_reserve_options -> ReserveOptions."""
    words = c_name[len("pagealloc_"):].split("_")
    return "".join(word.capitalize() for word in words)


def test_the_probe_sees_the_headers_structs():
    names = [layout["struct"] for layout in LAYOUTS]
    assert "pagealloc_client_options" in names
    assert "pagealloc_allocation_view" in names
    assert all(name.startswith("pagealloc_") for name in names)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: l["struct"])
def test_ctypes_struct_matches_the_header(layout):
    name = _ctypes_name(layout["struct"])
    twin = getattr(_native, name, None)
    assert twin is not None, (
        "%s has no ctypes struct %s in pagealloc/_native.py" %
        (layout["struct"], name))
    assert issubclass(twin, ctypes.Structure)
    c_fields = [field[0] for field in layout["fields"]]
    py_fields = [field[0] for field in twin._fields_]
    assert py_fields == c_fields, "%s: fields differ from %s" % (
        name, layout["struct"])
    for field_name, offset, size in layout["fields"]:
        member = getattr(twin, field_name)
        assert (member.offset, member.size) == (offset, size), (
            "%s.%s at offset %d, %d bytes; the header's is at %d, %d bytes" %
            (name, field_name, member.offset, member.size, offset, size))
    assert ctypes.sizeof(twin) == layout["size"], (
        "sizeof(%s) %d, the header's %d" %
        (name, ctypes.sizeof(twin), layout["size"]))
