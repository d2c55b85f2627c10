"""Text in Blender layouts (bpy-free helpers for ui/): labels that wrap, and a box whose drawing
bug shows as one line instead of taking the whole page with it."""

import textwrap
import traceback


def wrapped_labels(layout, text: str, *, width: int = 90, icon: str = "NONE", alert: bool = False):
    """Labels do not wrap in Blender: split a long message over several rows."""
    col = layout.column(align=True)
    col.alert = alert
    lines = textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)  # keep paths whole
    for i, line in enumerate(lines or [""]):
        col.label(text=line, icon=icon if i == 0 else "BLANK1" if icon != "NONE" else "NONE")
    return col



def draw_safely(layout, title: str, draw, *args) -> None:
    """``draw(layout, *args)``; a drawing bug shows as one line instead of taking the whole page
    (or panel) with it."""
    try:
        draw(layout, *args)
    except Exception as exc:
        traceback.print_exc()
        layout.label(text=f"{title} unavailable: {type(exc).__name__}: {exc}", icon="ERROR")
