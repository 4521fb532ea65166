"""The official openai and anthropic SDKs through `tokenmeter serve` in front of `tokenmeter sim`.

Run by scripts/sdk_acceptance.sh, which starts both processes and passes:
  TM_PROXY       the proxy's base URL (http://127.0.0.1:PORT)
  TM_SIM         the simulator's base URL
  TM_ACCESS_LOG  the proxy's access log file
  TM_MODEL       the served model name
  TM_PROXY_DOWN  a second proxy's base URL, whose upstream refuses connections (its own 502s)

The simulator runs without its stop rule, so every request generates exactly its limit and the
token counts below are exact. Every check is made; all failures are listed at the end, and the
exit status is 1 if there was any.
"""

import hashlib
import json
import os
import re
import sys
import time
import urllib.request

import anthropic
import openai

PROXY = os.environ["TM_PROXY"]
SIM = os.environ["TM_SIM"]
ACCESS_LOG = os.environ["TM_ACCESS_LOG"]
MODEL = os.environ["TM_MODEL"]
PROXY_DOWN = os.environ["TM_PROXY_DOWN"]
TIMEOUT_S = 30.0

TOOL_PARAMS = {
    "type": "object",
    "properties": {"path": {"type": "string"}},
    "required": ["path"],
}

failures = []


def check(cond, what):
    """Records a failed check (with what it was about) and carries on."""
    print(("  ok    " if cond else "  FAIL  ") + what)
    if not cond:
        failures.append(what)
    return cond


def pseudonym(key):
    """The user tokenmeter derives from a key it has no name for: key- + 8 hex of its SHA-256."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:8]


def get(url):
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as r:
        return r.read().decode()


def generation_tokens_total():
    """The simulator's vllm:generation_tokens_total (summed over its label sets)."""
    total = 0.0
    for line in get(SIM + "/metrics").splitlines():
        m = re.match(r"^vllm:generation_tokens_total(?:\{[^}]*\})?\s+(\S+)$", line)
        if m:
            total += float(m.group(1))
    return int(total)


def oai(key):
    return openai.OpenAI(base_url=PROXY + "/v1", api_key=key, timeout=TIMEOUT_S, max_retries=0)


def ant(key):
    return anthropic.Anthropic(base_url=PROXY, api_key=key, timeout=TIMEOUT_S, max_retries=0)


# Each call: its key (so its user), whether it streams, and what the SDK reported.
calls = []


def record(name, key, stream, prompt=None, completion=None, status=200):
    calls.append(
        {
            "name": name,
            "key": key,
            "stream": stream,
            "prompt": prompt,
            "completion": completion,
            "status": status,
        }
    )


def run_call(name, fn):
    """Runs one SDK call; an exception is a failed check, not the end of the run."""
    print(name)
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - every failure is reported, whatever its type
        check(False, f"{name}: the SDK call raised {type(e).__name__}: {e}")


def responses_streamed():
    key = "sk-tm-responses-stream"
    usage, deltas, types = None, 0, []
    with oai(key).responses.create(
        model=MODEL, input="def hello():", max_output_tokens=12, stream=True
    ) as stream:
        for ev in stream:
            types.append(ev.type)
            if ev.type == "response.output_text.delta":
                deltas += 1
            if ev.type == "response.completed":
                usage = ev.response.usage
    check(types[:2] == ["response.created", "response.in_progress"], "responses stream: starts with created, in_progress")
    check(types and types[-1] == "response.completed", "responses stream: ends with response.completed")
    check(usage is not None and usage.output_tokens == 12, f"responses stream: usage.output_tokens 12 ({usage})")
    check(deltas == 12, f"responses stream: 12 text deltas ({deltas})")
    record("responses streamed", key, True, usage and usage.input_tokens, usage and usage.output_tokens)


def responses_plain():
    key = "sk-tm-responses-plain"
    r = oai(key).responses.create(model=MODEL, input="list files", max_output_tokens=9)
    check(r.usage.output_tokens == 9, f"responses: usage.output_tokens 9 ({r.usage.output_tokens})")
    check(len(r.output_text.split()) == 9, f"responses: output_text has 9 words ({r.output_text!r})")
    record("responses non-streamed", key, False, r.usage.input_tokens, r.usage.output_tokens)


def responses_tool():
    key = "sk-tm-responses-tool"
    tools = [{"type": "function", "name": "read_file", "description": "Read a file", "parameters": TOOL_PARAMS}]
    usage, args, final = None, "", None
    with oai(key).responses.create(
        model=MODEL, input="read main.py", tools=tools, tool_choice="required",
        max_output_tokens=10, stream=True,
    ) as stream:
        for ev in stream:
            if ev.type == "response.function_call_arguments.delta":
                args += ev.delta
            if ev.type == "response.completed":
                usage, final = ev.response.usage, ev.response
    call = final.output[0] if final and final.output else None
    check(call is not None and call.type == "function_call" and call.name == "read_file", f"responses tool: a read_file call ({call})")
    check(call is not None and call.arguments == args and "path" in json.loads(args), f"responses tool: arguments are JSON with path ({args!r})")
    check(usage is not None and usage.output_tokens == 10, "responses tool: usage.output_tokens 10")
    record("responses forced tool", key, True, usage and usage.input_tokens, usage and usage.output_tokens)


def messages_streamed():
    key = "sk-ant-tm-messages-stream"
    prompt = completion = None
    text, types = "", []
    with ant(key).messages.create(
        model=MODEL, max_tokens=11, stream=True,
        messages=[{"role": "user", "content": "def hello():"}],
    ) as stream:
        for ev in stream:
            types.append(ev.type)
            if ev.type == "message_start":
                prompt = ev.message.usage.input_tokens
            if ev.type == "message_delta":
                completion = ev.usage.output_tokens
            if ev.type == "content_block_delta":
                text += ev.delta.text
    check(types[:2] == ["message_start", "content_block_start"], "messages stream: message_start, content_block_start")
    check(types and types[-1] == "message_stop", "messages stream: ends with message_stop")
    check(completion == 11, f"messages stream: message_delta usage.output_tokens 11 ({completion})")
    check(len(text.split()) == 11, f"messages stream: 11 words ({text!r})")
    record("messages streamed", key, True, prompt, completion)


def messages_plain():
    key = "sk-ant-tm-messages-plain"
    m = ant(key).messages.create(
        model=MODEL, max_tokens=7, system="You are a coding agent.",
        messages=[{"role": "user", "content": "now read main.py"}],
    )
    check(m.stop_reason == "max_tokens", f"messages: stop_reason max_tokens ({m.stop_reason})")
    check(m.usage.output_tokens == 7, f"messages: usage.output_tokens 7 ({m.usage.output_tokens})")
    check(len(m.content[0].text.split()) == 7, "messages: 7 words")
    record("messages non-streamed", key, False, m.usage.input_tokens, m.usage.output_tokens)


def messages_tool():
    key = "sk-ant-tm-messages-tool"
    tools = [{"name": "read_file", "description": "Read a file", "input_schema": TOOL_PARAMS}]
    # The SDK's stream helper accumulates the tool input from the partial JSON as it arrives.
    with ant(key).messages.stream(
        model=MODEL, max_tokens=8, tools=tools, tool_choice={"type": "any"},
        messages=[{"role": "user", "content": "read main.py"}],
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_message()
    block = final.content[0] if final.content else None
    check(block is not None and block.type == "tool_use" and block.name == "read_file", f"messages tool: a read_file tool_use ({block})")
    check(block is not None and isinstance(block.input, dict) and "path" in block.input, f"messages tool: input has path ({block and block.input})")
    check(final.usage.output_tokens == 8, f"messages tool: usage.output_tokens 8 ({final.usage.output_tokens})")
    record("messages forced tool", key, True, final.usage.input_tokens, final.usage.output_tokens)


def chat_tool():
    key = "sk-tm-chat-tool"
    tools = [{"type": "function", "function": {"name": "read_file", "description": "Read a file", "parameters": TOOL_PARAMS}}]
    chunks, usage_chunks, empty_choice_chunks, call_events, args = 0, 0, 0, 0, ""
    stream = oai(key).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "read main.py"}], tools=tools,
        tool_choice={"type": "function", "function": {"name": "read_file"}},
        max_tokens=9, stream=True,
    )
    for c in stream:
        chunks += 1
        if getattr(c, "usage", None) is not None:
            usage_chunks += 1
        if not c.choices:
            empty_choice_chunks += 1
            continue
        for tc in c.choices[0].delta.tool_calls or []:
            call_events += 1
            args += (tc.function.arguments or "") if tc.function else ""
    check(usage_chunks == 0 and empty_choice_chunks == 0, f"chat tool: the SDK sees no usage chunk ({usage_chunks} with usage, {empty_choice_chunks} without choices)")
    check(call_events == 9, f"chat tool: one tool-call delta per token, 9 ({call_events})")
    check("path" in json.loads(args or "{}"), f"chat tool: arguments are JSON with path ({args!r})")
    # The SDK sees no usage here: what it reports is the tool-call deltas it received.
    record("chat streamed named tool", key, True, None, call_events)


def unknown_models():
    key = "sk-tm-unknown-openai"
    try:
        oai(key).responses.create(model="no-such-model", input="x", max_output_tokens=2)
        check(False, "openai unknown model: raised nothing")
    except openai.NotFoundError:
        check(True, "openai unknown model: NotFoundError")
    record("openai unknown model", key, False, status=404)
    key = "sk-ant-tm-unknown-anthropic"
    try:
        ant(key).messages.create(model="no-such-model", max_tokens=2, messages=[{"role": "user", "content": "x"}])
        check(False, "anthropic unknown model: raised nothing")
    except anthropic.NotFoundError:
        check(True, "anthropic unknown model: NotFoundError")
    record("anthropic unknown model", key, False, status=404)


def proxy_errors():
    """The proxy's own 502 (its upstream refuses connections) as each SDK reads it: the exception
    class of the status, with the proxy's message; on Messages in the envelope vLLM answers
    Messages errors in, so the SDK cannot tell it from vLLM's."""
    try:
        anthropic.Anthropic(base_url=PROXY_DOWN, api_key="sk-ant-down", timeout=TIMEOUT_S, max_retries=0).messages.create(
            model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "x"}]
        )
        check(False, "anthropic, upstream down: raised nothing")
    except anthropic.InternalServerError as e:
        check(e.status_code == 502, f"anthropic, upstream down: InternalServerError with status 502 ({e.status_code})")
        body = e.body if isinstance(e.body, dict) else {}
        check(
            body.get("type") == "error" and body.get("error", {}).get("type") == "BadGatewayError",
            f"anthropic, upstream down: Messages error envelope with vLLM's type ({e.body!r})",
        )
        check("The inference server is unavailable" in str(e), f"anthropic, upstream down: the proxy's message ({e})")
    try:
        openai.OpenAI(base_url=PROXY_DOWN + "/v1", api_key="sk-down", timeout=TIMEOUT_S, max_retries=0).chat.completions.create(
            model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "x"}]
        )
        check(False, "openai, upstream down: raised nothing")
    except openai.InternalServerError as e:
        check(e.status_code == 502, f"openai, upstream down: InternalServerError with status 502 ({e.status_code})")
        check("The inference server is unavailable" in str(e), f"openai, upstream down: the proxy's message ({e})")
        check(e.type == "BadGatewayError", f"openai, upstream down: vLLM's error type ({e.type!r}, body {e.body!r})")


def read_log(want_lines):
    """The access log's records once it holds `want_lines` of them (it is flushed when idle)."""
    deadline = time.time() + TIMEOUT_S
    lines = []
    while time.time() < deadline:
        with open(ACCESS_LOG) as f:
            lines = [json.loads(l) for l in f if l.strip()]
        if len(lines) >= want_lines:
            break
        time.sleep(0.1)
    return [l for l in lines if l.get("type") == "request"]


def main():
    before = generation_tokens_total()
    for name, fn in [
        ("Responses, streamed", responses_streamed),
        ("Responses, non-streamed", responses_plain),
        ("Responses, forced tool, streamed", responses_tool),
        ("Messages, streamed", messages_streamed),
        ("Messages, non-streamed", messages_plain),
        ("Messages, forced tool, streamed", messages_tool),
        ("Chat, streamed, named tool, no stream_options", chat_tool),
        ("Unknown model in both SDKs", unknown_models),
    ]:
        run_call(name, fn)
    run_call("The proxy's own 502 in both SDKs", proxy_errors)
    generated = generation_tokens_total() - before

    print("Access log, /stats and the simulator's counter")
    lines = read_log(len(calls))
    check(len(lines) == len(calls), f"one access-log line per call ({len(lines)} lines, {len(calls)} calls)")
    by_user = {}
    for l in lines:
        by_user.setdefault(l.get("user"), []).append(l)
    for c in calls:
        user = pseudonym(c["key"])
        got = by_user.get(user, [])
        if not check(len(got) == 1, f"{c['name']}: one line for its key's user {user} (users seen: {sorted(map(str, by_user))})"):
            continue
        l = got[0]
        check(l.get("status") == c["status"], f"{c['name']}: status {c['status']} ({l.get('status')})")
        if c["status"] != 200:
            continue
        check(l.get("completion_tokens") == c["completion"], f"{c['name']}: completion_tokens {c['completion']} as the SDK reports ({l.get('completion_tokens')})")
        if c["prompt"] is not None:
            check(l.get("prompt_tokens") == c["prompt"], f"{c['name']}: prompt_tokens {c['prompt']} as the SDK reports ({l.get('prompt_tokens')})")
        check(l.get("outcome") == "ok", f"{c['name']}: outcome ok ({l.get('outcome')})")
        if c["stream"]:
            t, e = l.get("ttft_ms"), l.get("e2e_ms")
            check(t is not None and e is not None and 0 < t < e, f"{c['name']}: 0 < ttft_ms < e2e_ms ({t}, {e})")
    logged = sum(l.get("completion_tokens") or 0 for l in lines)
    check(logged == generated, f"sum of completion_tokens {logged} = the simulator's vllm:generation_tokens_total delta {generated}")
    stats = json.loads(get(PROXY + "/stats"))
    total = stats.get("totals", {}).get("completion_tokens")
    check(total == generated, f"/stats totals.completion_tokens {total} = {generated}")
    users = stats.get("users", {})
    for c in calls:
        user = pseudonym(c["key"])
        check(user in users, f"{c['name']}: /stats lists user {user}")

    print()
    if failures:
        print(f"SDK acceptance: {len(failures)} check(s) failed:")
        for f in failures:
            print("  - " + f)
        return 1
    print(f"SDK acceptance: all checks passed ({len(calls)} calls, {generated} tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
