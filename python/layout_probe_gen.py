#!/usr/bin/python3
"""Writes a C program that prints the layout of every struct the C ABI's
header defines, as the compiler lays it out: one JSON object per struct
(its size and, in declaration order, each field's name, offset and size).

    layout_probe_gen.py pagealloc.h > layout_probe.c

python/tests/test_native_layout.py compares that layout with the ctypes
structs of pagealloc/_native.py. The fields are read from the header's
text; a field this reads wrongly names no member, and the probe then fails
to compile.
"""

import re
import sys

_STRUCT = re.compile(r"typedef\s+struct\s+(\w+)\s*\{(.*?)\}\s*(\w+)\s*;",
                     re.S)
_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_FIELD = re.compile(r"(\w+)\s*(?:\[[^\]]*\])?\s*$")


def structs(header_text):
    """(name, [field names]) of each struct defined with a body."""
    text = _COMMENT.sub(" ", header_text)
    found = []
    for match in _STRUCT.finditer(text):
        tag, body, name = match.groups()
        if tag != name:
            raise SystemExit("typedef struct %s names it %s" % (tag, name))
        fields = []
        for declaration in body.split(";"):
            declaration = declaration.strip()
            if not declaration:
                continue
            field = _FIELD.search(declaration)
            if field is None:
                raise SystemExit("%s: cannot read the field in %r" %
                                 (name, declaration))
            fields.append(field.group(1))
        found.append((name, fields))
    return found


def main():
    with open(sys.argv[1]) as f:
        found = structs(f.read())
    if not found:
        raise SystemExit("no struct in %s" % sys.argv[1])
    out = ["#include <stddef.h>", "#include <stdio.h>",
           '#include "client/pagealloc.h"', "",
           "#define MEMBER_SIZE(type, member) sizeof(((type*)0)->member)", "",
           "int main(void) {"]
    for name, fields in found:
        out.append('  printf("{\\"struct\\": \\"%s\\", \\"size\\": %%zu, '
                   '\\"fields\\": [", sizeof(%s));' % (name, name))
        for i, field in enumerate(fields):
            out.append(
                '  printf("%s[\\"%s\\", %%zu, %%zu]", offsetof(%s, %s), '
                "MEMBER_SIZE(%s, %s));" %
                (", " if i else "", field, name, field, name, field))
        out.append('  printf("]}\\n");')
    out += ["  return 0;", "}", ""]
    sys.stdout.write("\n".join(out))


if __name__ == "__main__":
    main()
