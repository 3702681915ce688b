"""A griffe extension: docstrings written as plain text render as written.

meanfield's docstrings write inner products as `<A x, y>`. Markdown would take
`<A x, y>` for an HTML tag and the browser would swallow it, so outside code
spans every `<` becomes `&lt;` before mkdocstrings renders the docstring.
Loaded by mkdocs.yml (mkdocstrings' `extensions` option).
"""

import re

import griffe

# Code spans (`...`, ``...``) keep their text: `&lt;` would show literally there.
_CODE = re.compile(r"(`+)(?:.|\n)*?\1")


def escape_angle_brackets(text: str) -> str:
    """`text` with `<` outside code spans written as the entity `&lt;`."""
    out, last = [], 0
    for match in _CODE.finditer(text):
        out.append(text[last : match.start()].replace("<", "&lt;"))
        out.append(match.group(0))
        last = match.end()
    out.append(text[last:].replace("<", "&lt;"))
    return "".join(out)


class PlainTextDocstrings(griffe.Extension):
    """Escape `<` in every docstring once the object tree is built."""

    def on_object(self, *, obj, **kwargs) -> None:
        """Rewrite one object's docstring (every kind of object passes here)."""
        if obj.docstring is not None:
            obj.docstring.value = escape_angle_brackets(obj.docstring.value)
