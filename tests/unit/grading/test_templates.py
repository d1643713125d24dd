"""Prompts and targets: Jinja2 sandboxed, StrictUndefined, chat messages and few-shot."""

from __future__ import annotations

import pytest

from evalkube.grading import (
    BuiltinGrader,
    GraderTemplate,
    PromptTemplate,
    TemplateError,
    compile_template,
)

WHERE = "tasks[qa]"


def render(prompt: object, target: str | None = None, row: dict | None = None, **context: object):
    return PromptTemplate(prompt, target, WHERE).render(row or {}, context)  # type: ignore[arg-type]


def test_string_prompt_and_target() -> None:
    prompt, target = render(
        "Q: {{ item.question }}", "{{ item.answer }}", {"question": "2+2?", "answer": 4}
    )
    assert prompt == "Q: 2+2?"
    assert target == "4"


def test_row_is_also_available_as_row() -> None:
    prompt, _ = render("{{ row.q }}|{{ item.q }}", None, {"q": "x"})
    assert prompt == "x|x"


def test_no_prompt_and_no_target_render_none() -> None:
    assert render(None, None, {"a": 1}) == (None, None)


def test_trailing_newline_is_kept() -> None:
    prompt, _ = render("line\n", None, {})
    assert prompt == "line\n"


def test_no_html_autoescape() -> None:
    prompt, _ = render("{{ item.t }}", None, {"t": "<b>&'\""})
    assert prompt == "<b>&'\""


def test_chat_messages() -> None:
    prompt, target = render(
        [("system", "You answer in {{ item.lang }}."), ("user", "{{ item.question }}")],
        "{{ item.answer }}",
        {"lang": "French", "question": "Capital?", "answer": "Paris"},
    )
    assert prompt == [
        {"role": "system", "content": "You answer in French."},
        {"role": "user", "content": "Capital?"},
    ]
    assert target == "Paris"


def test_few_shot_loop_and_task_id_context() -> None:
    template = (
        "{% for ex in few_shot %}Q: {{ ex.q }}\nA: {{ ex.a }}\n{% endfor %}Q: {{ item.q }}\nA:"
    )
    prompt, _ = render(
        template,
        None,
        {"q": "3+3"},
        few_shot=[{"q": "1+1", "a": "2"}, {"q": "2+2", "a": "4"}],
        task_id="math",
    )
    assert prompt == "Q: 1+1\nA: 2\nQ: 2+2\nA: 4\nQ: 3+3\nA:"


def test_few_shot_in_chat_messages() -> None:
    prompt, _ = render(
        [("user", "{% for ex in few_shot %}{{ ex.q }};{% endfor %}{{ item.q }} ({{ task_id }})")],
        None,
        {"q": "c"},
        few_shot=[{"q": "a"}, {"q": "b"}],
        task_id="t1",
    )
    assert prompt == [{"role": "user", "content": "a;b;c (t1)"}]


def test_missing_field_is_an_error_naming_the_field() -> None:
    with pytest.raises(TemplateError) as info:
        render("Q: {{ item.question }}", None, {"questoin": "typo"})
    message = str(info.value)
    assert message.startswith("prompt:")
    assert "'question'" in message
    assert "check the row's field names" in message


def test_unknown_variable_is_refused_when_compiled_naming_it() -> None:
    with pytest.raises(TemplateError, match=r"^tasks\[qa\]\.prompt: unknown name\(s\) `few_shots`"):
        PromptTemplate("{{ few_shots }}", None, WHERE)


def test_missing_field_in_target_says_target() -> None:
    with pytest.raises(TemplateError, match=r"^target: .*'answer'"):
        render("ok", "{{ item.answer }}", {"q": 1})


def test_missing_field_in_a_chat_message_is_an_error() -> None:
    with pytest.raises(TemplateError, match="'nope'"):
        render([("user", "{{ item.nope }}")], None, {})


def test_missing_field_inside_a_loop_or_condition_is_still_an_error() -> None:
    with pytest.raises(TemplateError, match="'b'"):
        render("{% if item.b %}x{% endif %}", None, {"a": 1})


def test_default_filter_allows_optional_fields() -> None:
    prompt, _ = render("{{ item.opt | default('none') }}", None, {})
    assert prompt == "none"


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ item.__class__ }}",
        "{{ item.__init__.__globals__ }}",
        "{{ cycler.__init__.__globals__.os }}",
        "{{ lipsum.__globals__['os'].popen('id').read() }}",
        "{{ item.q.__class__.__base__.__subclasses__() }}",
        "{{ ().__class__.__bases__[0].__subclasses__() }}",
    ],
)
def test_sandbox_blocks_escapes(source: str) -> None:
    with pytest.raises(TemplateError) as info:
        render(source, None, {"q": "x"})
    message = str(info.value)
    # lipsum is not offered at all (lipsum(n) writes n paragraphs): an unknown name
    assert "unsafe" in message or "undefined" in message or "unknown name(s) `lipsum`" in message


def test_sandbox_blocks_format_string_attribute_escape() -> None:
    with pytest.raises(TemplateError):
        render("{{ '{0.__class__}'.format(item) }}", None, {})


def test_filter_failure_on_bad_data_is_a_template_error() -> None:
    with pytest.raises(TemplateError, match=r"^prompt: TypeError"):
        render("{{ item.a + 'x' }}", None, {"a": 1})


def test_syntax_error_names_the_field_and_line() -> None:
    with pytest.raises(TemplateError) as info:
        PromptTemplate("line one\nline two {{ item.x \n", None, WHERE)
    message = str(info.value)
    assert message.startswith("tasks[qa].prompt: template syntax error on line 2")


def test_syntax_error_in_target_names_target() -> None:
    with pytest.raises(
        TemplateError, match=r"^tasks\[qa\]\.target: template syntax error on line 1"
    ):
        PromptTemplate("ok", "{% if %}", WHERE)


def test_syntax_error_in_a_chat_message_names_its_index() -> None:
    with pytest.raises(
        TemplateError, match=r"^tasks\[qa\]\.prompt\[1\]\.content: template syntax error on line 3"
    ):
        PromptTemplate([("system", "fine"), ("user", "a\nb\n{% for %}")], None, WHERE)


def test_compile_template_syntax_error() -> None:
    with pytest.raises(TemplateError, match=r"^where: template syntax error on line 1"):
        compile_template("{{ }", "where")


def test_compiled_once_rendered_many_times() -> None:
    template = PromptTemplate("{{ item.n * 2 }}", "{{ item.n }}", WHERE)
    assert [template.render({"n": n}, {}) for n in range(3)] == [
        ("0", "0"),
        ("2", "1"),
        ("4", "2"),
    ]


def test_prompt_naming_sample_is_refused_with_where_sample_works() -> None:
    with pytest.raises(TemplateError) as info:
        PromptTemplate([("user", "{{ sample.output_text }}")], None, WHERE)
    assert str(info.value).startswith("tasks[qa].prompt[0].content: `sample` is not available")
    assert "grader's input templates" in str(info.value)


def test_jinja_globals_and_loop_variables_are_not_unknown_names() -> None:
    prompt, _ = render(
        "{% for i in range(2) %}{{ loop.index }}{{ item.q }}{% endfor %}", None, {"q": "x"}
    )
    assert prompt == "1x2x"


def test_grader_template_reads_item_and_sample_namespaces() -> None:
    template = GraderTemplate(
        "{{ sample.output_text }}|{{ item.answer }}|{{ sample.output_json.a }}"
        "|{{ sample.output_json }}|{{ sample.output_tools }}",
        "tasks[qa].graders[0].input",
    )
    sample = {"output_text": "hi", "output_json": {"a": [1, 2]}, "output_tools": []}
    assert template.render({"answer": "é"}, sample) == 'hi|é|[1, 2]|{"a": [1, 2]}|[]'


@pytest.mark.parametrize(
    ("value", "rendered"),
    [(True, "true"), (False, "false"), (None, "null"), (3, "3"), (0.5, "0.5"), ("True", "True")],
)
def test_grader_template_renders_non_strings_as_json(value: object, rendered: str) -> None:
    """OpenAI's templates render booleans and null JSON-style: `true`, not `True`."""
    template = GraderTemplate("{{ item.flag }}", "tasks[qa].graders[0].reference")
    assert template.render({"flag": value}, {}) == rendered


def test_string_check_of_true_against_a_boolean_field_matches() -> None:
    grader = BuiltinGrader(
        "string_check",
        input="{{ sample.output_text }}",
        reference="{{ item.expected }}",
        metric_id="m",
        where="tasks[qa].grader",
        operation="eq",
    )
    outcome = grader.grade({"output_text": "true"}, {"expected": True})
    assert outcome.scores == {"m": 1.0}
    assert grader.grade({"output_text": "None"}, {"expected": None}).scores == {"m": 0.0}


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            "{{ samples.output_text }}",
            "unknown name(s) `samples`; this template may use: item, sample",
        ),
        ("{{ row.q }}", "unknown name(s) `row`"),
    ],
)
def test_grader_template_refuses_other_namespaces(source: str, message: str) -> None:
    with pytest.raises(TemplateError, match=r"^tasks\[qa\]\.graders\[0\]\.input: ") as info:
        GraderTemplate(source, "tasks[qa].graders[0].input")
    assert message in str(info.value)


def test_grader_template_missing_field_is_a_render_error() -> None:
    template = GraderTemplate("{{ item.nope }}", "input")
    with pytest.raises(TemplateError, match="'nope'"):
        template.render({}, {})
