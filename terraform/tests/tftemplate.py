"""The subset of Terraform's template language that terraform/modules/cluster/templates use,
reimplemented so that CI can render the cloud-init documents without terraform:

- `${expr}` interpolation, where expr is a name or a dotted attribute path (`n.addr`);
- `%{ for x in expr }` ... `%{ endfor }` and `%{ if expr }` ... [`%{ else }`] ... `%{ endif }`,
  where an if condition is a path, optionally negated with `!`;
- the strip markers `~` (`${~`, `%{~` strip whitespace before; `~}` strips whitespace after),
  with HCL's reach: HCL splits literal text into one token per line, and a marker trims only the
  adjacent token (`~}` eats the rest of its line up to and including the newline, `{~` the
  whitespace of the previous line piece including that line's newline), never further lines;
- the escapes `$${` and `%%{`.

Anything else (function calls, operators) is rejected with an error, so a template that grows
beyond this subset fails the test instead of being rendered wrongly. `free_vars` lists the
variables a template needs, which the tests compare with what each templatefile() call passes.
"""

import re

_PATH = re.compile(r"^!?\s*[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_FOR = re.compile(r"^for\s+([A-Za-z_][A-Za-z0-9_]*)\s+in\s+(.+)$")


class TemplateError(Exception):
    pass


def _tokens(text):
    """Splits a template into ('text', s), ('interp', expr), ('dir', body) tokens, with the
    strip markers already applied to the neighbouring text tokens."""
    out = []
    i = 0
    buf = []
    strip_next = False
    n = len(text)
    while i < n:
        if text.startswith("$${", i) or text.startswith("%%{", i):
            buf.append(text[i + 1 : i + 3])
            i += 3
            continue
        if text.startswith("${", i) or text.startswith("%{", i):
            kind = "interp" if text[i] == "$" else "dir"
            end = text.find("}", i + 2)
            if end < 0:
                raise TemplateError(f"unterminated {text[i:i+2]} at offset {i}")
            body = text[i + 2 : end]
            lstrip = body.startswith("~")
            rstrip = body.endswith("~")
            body = body[1 if lstrip else 0 : len(body) - (1 if rstrip else 0)].strip()
            s = "".join(buf)
            if strip_next:
                s = _trim_first_line(s)
            if lstrip:
                s = _trim_last_line(s)
            out.append(("text", s))
            buf = []
            out.append((kind, body))
            strip_next = rstrip
            i = end + 1
            continue
        buf.append(text[i])
        i += 1
    s = "".join(buf)
    if strip_next:
        s = _trim_first_line(s)
    out.append(("text", s))
    return out


def _trim_first_line(s):
    """Whitespace trimmed off the first line token of s (up to and including its newline)."""
    i = s.find("\n")
    head, tail = (s, "") if i < 0 else (s[: i + 1], s[i + 1 :])
    return head.lstrip() + tail


def _trim_last_line(s):
    """Whitespace trimmed off the last line token of s (a token ends after a newline)."""
    j = s.rfind("\n", 0, len(s) - 1) if s.endswith("\n") else s.rfind("\n")
    return s[: j + 1] + s[j + 1 :].rstrip()


def _parse(tokens):
    """Builds a tree: list of nodes; node = ('text', s) | ('interp', path) |
    ('for', var, path, body) | ('if', path, then, else)."""
    pos = 0

    def block(stop):
        nonlocal pos
        nodes = []
        while pos < len(tokens):
            kind, body = tokens[pos]
            if kind == "dir" and body in stop:
                return nodes, body
            pos += 1
            if kind == "text":
                nodes.append(("text", body))
            elif kind == "interp":
                nodes.append(("interp", _expr(body)))
            else:
                m = _FOR.match(body)
                if m:
                    inner, end = block({"endfor"})
                    if end != "endfor":
                        raise TemplateError(f"'%{{ {body} }}' without endfor")
                    pos += 1
                    nodes.append(("for", m.group(1), _expr(m.group(2)), inner))
                elif body.startswith("if "):
                    cond = _expr(body[3:])
                    then, end = block({"else", "endif"})
                    other = []
                    if end == "else":
                        pos += 1
                        other, end = block({"endif"})
                    if end != "endif":
                        raise TemplateError(f"'%{{ {body} }}' without endif")
                    pos += 1
                    nodes.append(("if", cond, then, other))
                else:
                    raise TemplateError(f"unsupported directive '%{{ {body} }}'")
        return nodes, None

    nodes, end = block(set())
    if end is not None:
        raise TemplateError(f"unexpected '%{{ {end} }}'")
    return nodes


def _expr(body):
    body = body.strip()
    if not _PATH.match(body):
        raise TemplateError(f"expected a name or dotted path, found '{body}'")
    neg = body.startswith("!")
    path = body.lstrip("!").strip().split(".")
    return (neg, path)


def _lookup(expr, scope):
    neg, path = expr
    if path[0] not in scope:
        raise TemplateError(f"template variable '{path[0]}' is not defined")
    v = scope[path[0]]
    for attr in path[1:]:
        if not isinstance(v, dict) or attr not in v:
            raise TemplateError(f"'{'.'.join(path)}': no attribute '{attr}'")
        v = v[attr]
    if neg:
        if not isinstance(v, bool):
            raise TemplateError(f"'!' needs a bool, found {v!r}")
        return not v
    return v


def _string(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float, str)):
        return str(v)
    raise TemplateError(f"cannot interpolate {type(v).__name__} {v!r}")


def _render(nodes, scope, out):
    for node in nodes:
        if node[0] == "text":
            out.append(node[1])
        elif node[0] == "interp":
            out.append(_string(_lookup(node[1], scope)))
        elif node[0] == "for":
            items = _lookup(node[2], scope)
            if not isinstance(items, list):
                raise TemplateError(f"for needs a list, found {items!r}")
            for item in items:
                _render(node[3], {**scope, node[1]: item}, out)
        else:
            cond = _lookup(node[1], scope)
            if not isinstance(cond, bool):
                raise TemplateError(f"if needs a bool, found {cond!r}")
            _render(node[2] if cond else node[3], scope, out)


def render(text, variables):
    out = []
    _render(_parse(_tokens(text)), dict(variables), out)
    return "".join(out)


def free_vars(text):
    """Names the template reads from its variables (loop variables excluded)."""
    found = set()

    def walk(nodes, bound):
        for node in nodes:
            if node[0] == "interp":
                if node[1][1][0] not in bound:
                    found.add(node[1][1][0])
            elif node[0] == "for":
                if node[2][1][0] not in bound:
                    found.add(node[2][1][0])
                walk(node[3], bound | {node[1]})
            elif node[0] == "if":
                if node[1][1][0] not in bound:
                    found.add(node[1][1][0])
                walk(node[2], bound)
                walk(node[3], bound)

    walk(_parse(_tokens(text)), set())
    return found
