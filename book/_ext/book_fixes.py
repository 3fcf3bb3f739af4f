"""Small fixes to the HTML that the book's real-browser test found.

Sphinx 7.4 adds an inline script that an extension registers after the builder has started twice
(once with filename None, once with ''). sphinx-thebe registers `const THEBE_JS_URL = ...` that
way, and the second copy throws "Identifier 'THEBE_JS_URL' has already been declared" on every
page. Each page keeps one copy of each script.
"""


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


def setup(app):
    app.connect("html-page-context", _one_of_each_script)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
