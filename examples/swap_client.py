"""Plain ``openai`` code made session-aware by swapping the client class.

Nothing below uses the agent framework: it is an ordinary chat loop with a tool. The
only changes from stock code are ``HintedOpenAI`` instead of ``OpenAI``, a
``hint_scope`` around the conversation, and (optionally) control events around the tool,
so the server knows the session, the expected tool wait, and when the session ends.

    python examples/swap_client.py --base-url http://127.0.0.1:8000/v1 --model tiny
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from agentsdk import ControlChannel, HintedOpenAI, hint_scope
from hints_spec import ToolEnd, ToolStart

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The current time.",
            "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
            "strict": True,
        },
    }
]


def main(base_url: str, model: str) -> None:
    client = HintedOpenAI(base_url=base_url, api_key="unused")  # was: OpenAI(...)
    control = ControlChannel(client)
    messages: list[Any] = [
        {"role": "system", "content": "You are a helpful assistant with a clock. " * 20},
        {"role": "user", "content": "What time is it?"},
    ]
    with hint_scope(session="swap-demo", ttl=600):
        for turn in range(3):
            last = turn == 2
            with hint_scope(gap=0.5, end=last):  # ends the session with its last request
                response = client.chat.completions.create(
                    model=model,
                    messages=messages,
                    tools=TOOLS,
                    tool_choice="none"
                    if last
                    else {"type": "function", "function": {"name": "get_time"}},
                    max_tokens=128,
                )
            usage = response.usage
            details = usage.prompt_tokens_details if usage else None
            cached = details.cached_tokens if details else 0
            prompt = usage.prompt_tokens if usage else 0
            print(f"turn {turn}: {prompt} prompt tokens, {cached} cached")
            message = response.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls or []:
                control.send_sync("swap-demo", [ToolStart(tool="get_time", eta=0.5)])
                output = time.strftime("%H:%M:%S")
                control.send_sync("swap-demo", [ToolEnd(tool="get_time")])
                messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    client.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default="tiny")
    args = parser.parse_args()
    main(args.base_url, args.model)
