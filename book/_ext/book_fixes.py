"""Small fixes to the HTML that the book's real-browser test found.

A notebook's first cell is the shared setup cell, above the title: Colab runs it first. On the
book's page the title comes first, then the setup cell (the cell moves into the title's section,
right after the title).

The book's own style sheet (static/smol.css) wraps long outputs, lets wide tables and display
math scroll inside their box on a phone, and keeps the grading tables readable in dark mode.

Sphinx 7.4 adds an inline script that an extension registers after the builder has started twice
(once with filename None, once with ''). sphinx-thebe registers `const THEBE_JS_URL = ...` that
way, and the second copy throws "Identifier 'THEBE_JS_URL' has already been declared" on every
page. Each page keeps one copy of each script.
"""

from pathlib import Path


def _one_of_each_script(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for js in scripts:
        key = (js.filename or "", js.priority, tuple(sorted(js.attributes.items())))
        if key not in seen:
            seen.add(key)
            unique.append(js)
    context["script_files"] = unique


def _title_first(app, doctree):
    """Move cells that come before a notebook's first section (the setup cell) to just after the
    section's title."""
    from docutils import nodes

    children = list(doctree.children)
    first = next((i for i, node in enumerate(children) if isinstance(node, nodes.section)), None)
    if not first:
        return
    cells = [node for node in children[:first]
             if isinstance(node, nodes.container) and "cell" in node.get("classes", [])]
    if not cells:
        return
    section = children[first]
    at = next((i + 1 for i, node in enumerate(section.children) if isinstance(node, nodes.title)), 0)
    for cell in cells:
        doctree.remove(cell)
    for offset, cell in enumerate(cells):
        section.insert(at + offset, cell)


def _add_static(app, config):
    config.html_static_path.append(str(Path(__file__).parent / "static"))


def setup(app):
    app.connect("html-page-context", _one_of_each_script)
    app.connect("doctree-read", _title_first)
    app.connect("config-inited", _add_static)
    app.add_css_file("smol.css")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
