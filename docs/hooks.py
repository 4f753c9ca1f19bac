"""mkdocs hooks for the nbqat site (loaded through ``hooks:`` in ``mkdocs.yml``).

nbqat's docstrings are numpydoc and use Sphinx roles (``:func:`clip_coef```,
``:class:`~nbqat.FakeQuantize```). Markdown renders those as the literal role followed by code;
this hook turns them into optional cross-references that mkdocs-autorefs resolves to the API
pages when the target is documented there (and leaves as plain code otherwise, without a
warning). A leading ``~`` shows only the last component, as in Sphinx.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(
    r":(?:py:)?(?:class|func|meth|mod|attr|data|obj|exc|const):<code>(?P<tilde>~?)(?P<target>[^<]+)</code>"
)

_EXPLICIT = re.compile(r"^(.*?)\s*&lt;(.+?)&gt;$")


def _resolver(html: str) -> dict[str, str]:
    """Short name -> full identifier of the objects documented on this page; a short name that
    fits several objects (``forward``) is left out rather than linked to the wrong one."""
    found: dict[str, set[str]] = {}
    for ident in re.findall(r'id="(nbqat(?:\.[A-Za-z_][A-Za-z0-9_]*)+)"', html):
        parts = ident.split(".")
        for i in range(1, len(parts)):
            found.setdefault(".".join(parts[i:]), set()).add(ident)
    return {short: idents.pop() for short, idents in found.items() if len(idents) == 1}


def on_page_content(html: str, **kwargs: Any) -> str:
    """Replace Sphinx roles left in rendered docstrings by optional autorefs.

    Unqualified targets (``clip_coef``, ``FakeQuantize.forward``) are resolved against the
    objects documented on the same page; anything else is passed to autorefs as written.
    """
    local = _resolver(html)

    def replace(m: re.Match[str]) -> str:
        target = m.group("target").strip()
        explicit = _EXPLICIT.match(target)  # Sphinx's "title <target>" form
        if explicit:
            title, target = explicit.group(1), explicit.group(2)
        else:
            title = target.rsplit(".", 1)[-1] if m.group("tilde") else target
        ident = target.lstrip(".").removesuffix("()")
        ident = local.get(ident, ident)
        return f'<autoref identifier="{ident}" optional><code>{title}</code></autoref>'

    return _ROLE.sub(replace, html)
