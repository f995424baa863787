"""Client and server traces join: vLLM started with ``--otlp-traces-endpoint`` exports its
``llm_request`` span as a child of the run's ``chat`` span (the ``traceparent`` the
hinted client sends), here to an OTLP/HTTP receiver on 127.0.0.1."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentsdk import HintedAsyncOpenAI, RunConfig, Runner
from server_ext import LocalServer, local_server

from sdk_calls import coder

pytestmark = [pytest.mark.server, pytest.mark.anyio]


class _Receiver(BaseHTTPRequestHandler):
    """OTLP/HTTP (protobuf) trace receiver: keeps (name, trace id, span id, parent id)."""

    spans: ClassVar[list[tuple[str, bytes, bytes, bytes]]] = []

    def do_POST(self) -> None:
        data = self.rfile.read(int(self.headers["content-length"]))
        if self.headers.get("content-encoding") == "gzip":
            data = gzip.decompress(data)
        request = ExportTraceServiceRequest.FromString(data)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                for span in scope.spans:
                    self.spans.append((span.name, span.trace_id, span.span_id, span.parent_span_id))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def traced_server(
    test_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalServer]:
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=receiver.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{receiver.server_address[1]}/v1/traces"
    try:
        with local_server(
            test_model_dir,
            extension=False,
            kv_blocks=64,
            max_model_len=2048,
            args=["--otlp-traces-endpoint", endpoint],
            env={
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
                "OTEL_BSP_SCHEDULE_DELAY": "100",
            },
            log_dir=tmp_path_factory.mktemp("traced-logs"),
        ) as server:
            yield server
    finally:
        receiver.shutdown()
        receiver.server_close()


async def test_the_servers_request_span_is_a_child_of_the_clients_chat_span(
    traced_server: LocalServer,
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    client = HintedAsyncOpenAI(base_url=traced_server.base_url, api_key="unused", max_retries=0)
    async with client:
        await Runner.run(
            coder(traced_server, "list_dir"),
            "List the project.",
            client=client,
            run_config=RunConfig(tracer_provider=provider),
        )
    chats = {
        (span.context.trace_id, span.context.span_id)
        for span in exporter.get_finished_spans()
        if span.name.startswith("chat ")
    }
    assert len(chats) == 2
    deadline = time.monotonic() + 30  # the server exports in batches
    joined: set[tuple[int, int]] = set()
    while time.monotonic() < deadline and joined != chats:
        time.sleep(0.2)
        joined = {
            (int.from_bytes(trace_id, "big"), int.from_bytes(parent, "big"))
            for name, trace_id, _, parent in list(_Receiver.spans)
            if name == "llm_request"
        } & chats
    assert joined == chats, _Receiver.spans
