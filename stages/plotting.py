"""matplotlib for the reports, imported only when a report is drawn (a cached run never pays for it)."""

from __future__ import annotations

import base64
import io


def pyplot():
    """pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png(fig) -> str:
    """The figure as base64 PNG."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()
