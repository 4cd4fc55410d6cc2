"""Building an engine's classes whose fields differ between its versions."""

import dataclasses


def with_known_fields(cls, **fields):
    """An instance of `cls` (a NamedTuple, a msgspec Struct or a dataclass
    of whichever version of SGLang or vLLM is installed, or this package's
    stand-in) given those of `fields` that version has; all of them for a
    class that lists none."""
    known = getattr(cls, "_fields", None)
    if known is None:
        known = getattr(cls, "__struct_fields__", None)
    if known is None and dataclasses.is_dataclass(cls):
        known = [f.name for f in dataclasses.fields(cls)]
    if known is not None:
        fields = {k: v for k, v in fields.items() if k in known}
    return cls(**fields)
