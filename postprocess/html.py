"""Jinja2 rendering for the report: the page lives in ``templates/``, the code only prepares values.

Autoescaping is on for every template, so a run id, an error text or a note from a results folder
someone else wrote can never inject markup into the page.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape


@cache
def environment() -> Environment:
    return Environment(
        loader=PackageLoader("tailgate.postprocess", "templates"),
        autoescape=select_autoescape(["html", "j2"], default_for_string=True, default=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render(template: str, **context: Any) -> str:
    """One template rendered with ``context``."""
    return environment().get_template(template).render(**context)
