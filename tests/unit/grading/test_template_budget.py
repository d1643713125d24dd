"""Each way a template can grow text or spin is refused before it costs the host: at
compile time for constants, at render time for the rest; ordinary templates render as
before. (The same attacks through ``evalkube validate``/``run`` with a memory ceiling:
``tests/security/test_templates.py``.)"""

from __future__ import annotations

import os
import re
import resource
import time

import pytest

from evalkube.grading import GraderTemplate, PromptTemplate, TemplateError


def render(source: str, row: dict[str, object] | None = None) -> str:
    prompt, _ = PromptTemplate(source, None, "tasks[t]").render(
        row or {"q": "hello"}, {"few_shot": [], "task_id": "t"}
    )
    return str(prompt)


def refusal(source: str) -> str:
    """The TemplateError of rendering ``source``, in a forked child with 1 GiB of address
    space and 30 CPU seconds: an attack that got through fails the test, not the machine."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read_end)
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        resource.setrlimit(resource.RLIMIT_CPU, (30, 30))
        try:
            answer = f"rendered {len(render(source))} characters"
        except TemplateError as exc:
            answer = "refused: " + str(exc)
        except BaseException as exc:
            answer = f"failed: {type(exc).__name__}"
        os.write(write_end, answer.encode()[:4000])
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        answer = pipe.read().decode()
    os.waitpid(pid, 0)
    return answer or "the child died (memory or CPU limit)"


def quick_refusal(source: str) -> str:
    """``refusal(source)``, which must come in under 10 s: a template is refused before it
    runs, not after."""
    started = time.monotonic()
    answer = refusal(source)
    assert time.monotonic() - started < 10, "refused only after it ran"
    return answer


@pytest.mark.parametrize(
    ("source", "refused"),
    [
        ("{{ 'x' * 500000000 }}", "`*` would build more than 16,000,000"),
        ("{{ 9 ** (9 ** 9) }}", "`**` would build more than"),
        ("{{ 'x'|center(1000000000) }}", "a width of 1,000,000,000"),
        ("{{ 'x'.ljust(1000000000) }}", "a width of 1,000,000,000"),
        ("{{ ('x' * 100000).replace('', 'y' * 100000) }}", "`replace` would build"),
        ("{{ ('x' * 100000)|replace('x', 'y' * 100000) }}", "`replace` filter would build"),
        ("{{ '%0999999999d' % 1 }}", "a width of 999,999,999"),
        ("{{ '%*d'|format(999999999, 1) }}", "`*` widths are not allowed"),
        ("{{ '{:>999999999}'.format(1) }}", "a width of 999,999,999"),
        ("{{ (['x' * 99999] * 99999)|join }}", "`*` would build"),
        ("{{ 'a\tb'.expandtabs(1000000000) }}", "a width of 1,000,000,000"),
        ("{{ 'x'|indent(1000000000) }}", "a width of 1,000,000,000"),
        (
            "{% set ns = namespace(s='ab') %}{% for i in range(64) %}"
            "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
            "`~` would build",
        ),
        (
            "{% set l = [] %}{% for i in range(100000) %}{{ l.append('x' * 1000) or '' }}"
            "{% endfor %}{{ l|join }}",
            "would build more than",
        ),
        (
            "{% for i in range(100000) %}{% for j in range(100000) %}xxxxxxxxxx"
            "{% endfor %}{% endfor %}",
            "renders more than 1,000,000 characters|took longer than 2 s",  # a slow machine
        ),
        (
            "{% macro m() %}{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}"
            "{% endmacro %}{% set x = m() %}done",
            "more than",
        ),
        (
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            "took longer than 2 s",
        ),
        # a generator is drawn into a list, then sized: a thousand separators, not none
        (
            "{% set s = range(1000)|map('string')|join('x' * 100000) %}",
            "the `join` filter would build",
        ),
        ("{% set s = ('x' * 100000).join(range(1000)|map('string')) %}", "`join` would build"),
        # each `%` or replacement field may print all the arguments, at the widest width
        ("{% set s = '%(a(b))200000000s' % {'a(b)': 'x'} %}", "a width of 200,000,000"),
        (
            "{% set s = ('%(a)s' * 1000)|format(a='x' * 100000) %}",
            "the `format` filter would build",
        ),
        ("{% set s = ('{0}' * 1000).format('x' * 100000) %}", "str.format would build"),
        ("{% set s = ('{a}' * 1000).format_map({'a': 'x' * 100000}) %}", "str.format would build"),
        ("{% set s = ('%(a)f' * 100000) % {'a': 1e308} %}", "`%` would build"),
        ("{% set s = '{:>99999999}{'.format(1) %}", "a width of 99,999,999"),  # then fails
        # a filter that works on the text of its input: sized on that text
        ("{% set s = ['%100000000s']|format('x') %}", "a width of 100,000,000"),
        (
            "{% set s = (10 ** 4000)|replace('', 'y' * 20000) %}",
            "the `replace` filter would build",
        ),
        ("{% set s = 123|center(100000000) %}", "a width of 100,000,000"),
        # every line break `str.splitlines` knows
        ("{% set s = ('a\\ra' * 5000)|indent(20000) %}", "the `indent` filter would build"),
        # an argument used once per character, item or line
        (
            "{% set s = ('http://a.com ' * 1000)|urlize(target='x' * 100000) %}",
            "the `urlize` filter would build",
        ),
        (
            "{% set s = (range(2000)|list)|tojson(indent=50000) %}",
            "the `tojson` filter would build",
        ),
        (
            "{% set s = ('a' * 300000)|trim('b' * 300000 ~ 'a') %}",
            "the `trim` filter would build",
        ),
        (
            "{% set i = [] %}{% set ns = namespace(o=i) %}{% for _ in range(10) %}"
            "{% set ns.o = {'k' * 10000: ns.o} %}{% endfor %}{{ i.extend(range(1000)|list) or '' }}"
            "{% set s = ns.o|pprint %}",
            "the `pprint` filter would build",
        ),
        # quadratic, or many references, or a huge integer, inside one call the clock
        # cannot stop
        ("{% set s = ([[0]] * 40000)|sum(start=[]) %}", "the `sum` filter would build"),
        ("{% set s = range(10000)|batch(1)|sum(start=[]) %}", "the `sum` filter would build"),
        (
            "{% set s = range(1)|batch(10000000, 'z' * 1000)|list %}",
            "the `batch` filter would build",
        ),
        (
            "{% set s = range(1)|slice(10000000, 'z' * 1000)|list %}",
            "the `slice` filter would build",
        ),
        ("{% set s = 3 ** 10000000 %}", "`**` would build an integer of more than"),
        ("{% set s = 5|round(-1000000000) %}", "the `round` filter would build an integer"),
        # a negative width refunds nothing
        (
            "{% set s = ('\\t' * 100000).expandtabs(-100000000) %}"
            "{% set a = item.q * 2000000 %}{% set b = item.q * 2000000 %}",
            "`*` would build more than",
        ),
    ],
)
def test_an_attack_is_refused_naming_the_field(source: str, refused: str) -> None:
    answer = quick_refusal(source)
    assert answer.startswith(("refused: tasks[t].prompt: ", "refused: prompt: ")), answer
    assert re.search(refused.replace("(", r"\(").replace("*", r"\*"), answer), answer


def _doubled(names: str, depth: int) -> str:
    """``{% set a = [a, a] %}`` ``depth`` times for each of ``names``: a list that stands
    for 2**depth copies of its leaf in ``depth + 1`` objects."""
    return "".join(f"{{% set {n} = [{n}, {n}] %}}" for _ in range(depth) for n in names)


# a (x) and b (y) nest 2**13 references to an empty list each: cheap to build, and once x
# and y each hold a (separately built) list of 2**13 leaves, a == b walks 2**26 leaves
_GRAFTED = (
    "{% set x = [] %}{% set y = [] %}{% set a = [x] %}{% set b = [y] %}"
    + _doubled("ab", 13)
    + "{% set c = [b] %}{% set d = [a, b] %}{% set p = ['z'] %}{% set q = ['z'] %}"
    + _doubled("pq", 13)
    + "{{ x.append(p) or '' }}{{ y.append(q) or '' }}"
)
_CHARGED = "would (build|hold|compare) more than 16,000,000 characters"


@pytest.mark.parametrize(
    ("source", "refused"),
    [
        # the same list twice is twice its size: 40 doublings render 2**40 * 12 characters
        ("{% set a = ['xxxxxxxx'] %}" + _doubled("a", 40) + "{{ a }}", _CHARGED),
        (
            "{% set a = ('xxxxxxxx',) %}"
            + "{% set a = (a, a) %}" * 40
            + "{{ a|length }}{{ a|string }}",
            _CHARGED,
        ),
        (
            "{% set a = {'k': 'xxxxxxxx'} %}" + "{% set a = {'l': a, 'r': a} %}" * 40 + "{{ a }}",
            _CHARGED,
        ),
        (
            "{% set a = dict(k='xxxxxxxx') %}" + "{% set a = dict(l=a, r=a) %}" * 40 + "{{ a }}",
            _CHARGED,
        ),
        # grown after it was built: charged where it is used
        (
            "{% set x = [] %}{% set a = [x] %}"
            + _doubled("a", 17)
            + "{{ x.append('y' * 100000) or '' }}{{ a }}",
            "renders more than 1,000,000 characters",
        ),
        # CPU: two lists built apart compare leaf by leaf, 2**26 times, in one `==`
        (
            "{% set a = ['xxxxxxxx'] %}{% set b = ['xxxxxxxx'] %}"
            + _doubled("ab", 26)
            + "{{ a == b }}",
            _CHARGED,
        ),
        (_GRAFTED + "{{ a == b }}", "`==` would compare more than 16,000,000"),
        (_GRAFTED + "{{ a != b or a < b }}", "`!=` would compare more than 16,000,000"),
        (_GRAFTED + "{{ a in c }}", "`in` would compare more than 16,000,000"),
        (_GRAFTED + "{{ a is eq b }}", "the `eq` test would compare more than 16,000,000"),
        (_GRAFTED + "{{ a is in c }}", "the `in` test would compare more than 16,000,000"),
        (_GRAFTED + "{{ c.count(a) }}", "`count` would build more than 16,000,000"),
        (_GRAFTED + "{{ d|sort }}", "the `sort` filter would build more than 16,000,000"),
        (_GRAFTED + "{{ [a, b]|max }}", "a list literal would build more than 16,000,000"),
        # an argument is not printed to be sized: `a` prints as 1.3 GB
        (
            "{% set x = [] %}{% set a = [x] %}"
            + _doubled("a", 17)
            + "{{ x.append('y' * 10000) or '' }}{{ 'a'|replace('a', a) }}",
            "the `replace` filter would build more than 16,000,000",
        ),
        # a list's `count` compares with each of its elements: 20,000 lists of 5,000
        (
            "{% set y = [] %}{% set l = [y] * 20000 %}{{ y.extend(range(5000)|list) or '' }}"
            "{{ l.count(range(5000)|list) }}",
            "`count` would build more than 16,000,000",
        ),
    ],
)
def test_a_shared_or_compared_container_is_charged_in_full(source: str, refused: str) -> None:
    answer = quick_refusal(source)
    assert answer.startswith("refused: prompt: "), answer
    assert re.search(refused, answer), answer


def test_a_grader_template_names_its_field() -> None:
    template = GraderTemplate("{% for i in range(10**5) %}{{ 'x' * 99 }}{% endfor %}", "g.input")
    with pytest.raises(TemplateError, match=r"^g\.input: renders more than"):
        template.render({}, {})


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{{ item.q|upper }} {{ item.q * 2 }}", "HELLO hellohello"),
        ("{% for c in item.q %}{{ c }}-{% endfor %}", "h-e-l-l-o-"),
        ("{{ '%05.1f'|format(3.14159) }} {{ '{:>6}'.format('ab') }}", "003.1     ab"),
        (
            "{{ 2 ** 64 }} {{ [1, 2] + [3] }} {{ item.q ~ '!' }}",
            "18446744073709551616 [1, 2, 3] hello!",
        ),
        ("{{ item.q|center(9) }}|{{ ', '.join(['a', 'b']) }}", "  hello  |a, b"),
        (
            "{% set l = [item.q, item.q] %}{% set d = {'k': l} %}{{ d.k|join('-') }} "
            "{{ (1, [2]) }} {{ {'a': 1}['a'] }}",
            "hello-hello (1, [2]) 1",
        ),
        (
            "{% for a, b in [(1, 2), (3, 4)] %}{{ a + b }}{% endfor %} "
            "{% set u, v = 5, 6 %}{{ u * v }}",
            "37 30",
        ),
        (
            "{{ [1, [2]] == [1, [2]] }} {{ 'q' in item }} {{ 3 in range(10) }} "
            "{{ 1 < 2 < 3 }} {{ 'h' in item.q }} {{ [1] is in [[1]] }} {{ 2 is eq 2 }}",
            "True True True True True True True",
        ),
        (
            "{{ range(3)|map('string')|join(', ') }} {{ ', '.join(['a', 'b']|map('upper')) }} "
            "{{ [1, 2, 3]|select('odd')|first }} {{ [3, 1, 2]|sort|join }} "
            "{{ (range(4)|reject('odd')|list)|length }}",
            "0, 1, 2 A, B 1 123 2",
        ),
        (
            "{{ '%s=%d'|format('a', 1) }} {{ '%(k)s'|format(k='v') }} {{ '%d%%' % 50 }} "
            "{{ '{0}-{0}'.format('x') }} {{ '{a}'.format_map({'a': 1}) }} {{ 7|center(3) }}",
            "a=1 v 50% x-x 1  7 ",
        ),
        (
            "{{ 'a\\nb\\r\\nc'|indent(2) }}|{{ {'k': [1, 2]}|tojson }}|{{ [1]|tojson(indent=2) }}"
            "|{{ {'a': [1]}|pprint }}",
            "a\n  b\n  c|{\"k\": [1, 2]}|[\n  1\n]|{'a': [1]}",
        ),
        (
            "{{ [1, 2, 3]|batch(2, 0)|list }} {{ [1, 2, 3]|slice(2)|list }} {{ [1, 2, 3]|sum }} "
            "{{ [[1], [2]]|sum(start=[]) }} {{ [{'n': 2}, {'n': 3}]|sum(attribute='n') }} "
            "{{ 2.567|round(1) }} {{ 2.5|round(0, 'floor') }} {{ ' x '|trim }}|"
            "{{ 'ab'|replace('b', 'c') }} {{ ['x', 'y']|map('upper')|list }} {{ 'a b'|urlize }}",
            "[[1, 2], [3, 0]] [[1, 2], [3]] 6 [1, 2] 5 2.6 2.0 x|ac ['X', 'Y'] a b",
        ),
    ],
)
def test_ordinary_templates_render_as_before(source: str, expected: str) -> None:
    assert render(source) == expected
