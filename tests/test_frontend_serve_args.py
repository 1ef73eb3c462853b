"""vLLM 0.33's `vllm serve` options in the Rust frontend, end to end: the
frontend is started by `RustFrontendProcessManager` with the server arguments
(as `--args-json`) in front of the reference engine's `echo` model (which
answers with the prompt it received, so a test reads the prompt back), and
the clients are real: the `openai` package, `httpx2` verifying a
certificate generated here with the `openssl` command, plain sockets."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import urllib.request
from pathlib import Path

import httpx2
import openai
import pytest

from tests.support.wait import WaitTimeout, wait_until
from tests.test_frontend import serving

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


@pytest.fixture(autouse=True)
def _short_engine_wait(monkeypatch):
    monkeypatch.setenv("VLLM_ENGINE_READY_TIMEOUT_S", "30")


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(directory: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, both signed by the CA."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=test-ca",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            cwd=directory)  # fmt: skip
    for name, usage, san in (("server", "serverAuth", "IP:127.0.0.1"), ("client", "clientAuth", "DNS:client")):
        openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=directory)
        (directory / f"{name}.ext").write_text(
            f"subjectAltName={san}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage={usage}\n"
        )
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.pem", "-days", "1", "-extfile", f"{name}.ext", cwd=directory)  # fmt: skip
    return {name: directory / name for name in ("ca.pem", "server.key", "server.pem", "client.key", "client.pem")}


def https_client(port: int, pki: dict[str, Path], cert: bool = False) -> openai.OpenAI:
    context = ssl.create_default_context(cafile=str(pki["ca.pem"]))
    if cert:
        context.load_cert_chain(str(pki["client.pem"]), str(pki["client.key"]))
    http = httpx2.Client(verify=context, timeout=30)
    return openai.OpenAI(base_url=f"https://127.0.0.1:{port}/v1", api_key="x", max_retries=0, http_client=http)


def wait_https_ready(stack, context: ssl.SSLContext) -> None:
    """Waits for /health over TLS (the plain-HTTP readiness check cannot work on a TLS port)."""

    def healthy() -> bool:
        assert stack.frontend.processes[0].is_alive(), stack.frontend_log()
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{stack.port}/health", context=context, timeout=5) as r:
                return r.status == 200
        except OSError:
            return False

    try:
        wait_until(healthy, "/health over TLS", 60)
    except WaitTimeout:
        raise AssertionError(stack.frontend_log()) from None


def test_tls_serves_a_verifying_openai_client_and_refuses_plain_http(tmp_path):
    pki = make_pki(tmp_path)
    args = {"ssl_keyfile": str(pki["server.key"]), "ssl_certfile": str(pki["server.pem"])}
    with serving(tmp_path, **args) as stack:
        wait_https_ready(stack, ssl.create_default_context(cafile=str(pki["ca.pem"])))
        completion = https_client(stack.port, pki).completions.create(model="echo", prompt="hello", max_tokens=3)
        assert completion.choices[0].text == "hel"
        # A client that does not trust the CA refuses the server.
        with pytest.raises(openai.APIConnectionError):
            untrusted = openai.OpenAI(base_url=f"https://127.0.0.1:{stack.port}/v1", api_key="x", max_retries=0)
            untrusted.models.list()
        # Plain HTTP on the TLS port gets no HTTP answer.
        with socket.create_connection(("127.0.0.1", stack.port), timeout=10) as plain:
            plain.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = plain.recv(4096)
        assert not answer.startswith(b"HTTP/"), answer
        assert "https://" in stack.frontend_log()


def test_tls_client_certificates_are_required_when_ssl_cert_reqs_says_so(tmp_path):
    pki = make_pki(tmp_path)
    args = {
        "ssl_keyfile": str(pki["server.key"]),
        "ssl_certfile": str(pki["server.pem"]),
        "ssl_ca_certs": str(pki["ca.pem"]),
        "ssl_cert_reqs": int(ssl.CERT_REQUIRED),
    }
    with serving(tmp_path, **args) as stack:
        with_cert = ssl.create_default_context(cafile=str(pki["ca.pem"]))
        with_cert.load_cert_chain(str(pki["client.pem"]), str(pki["client.key"]))
        wait_https_ready(stack, with_cert)
        models = https_client(stack.port, pki, cert=True).models.list()
        assert [m.id for m in models.data] == ["echo"]
        with pytest.raises(openai.APIConnectionError):
            https_client(stack.port, pki, cert=False).models.list()


def preflight(url: str, origin: str, method: str, headers: str | None = None) -> httpx2.Response:
    request_headers = {"Origin": origin, "Access-Control-Request-Method": method}
    if headers is not None:
        request_headers["Access-Control-Request-Headers"] = headers
    return httpx2.options(url, headers=request_headers)


def test_cors_rules_match_vllm(tmp_path):
    args = {
        "allowed_origins": ["https://good.example"],
        "allowed_methods": ["GET", "POST"],
        "allowed_headers": ["Authorization"],
        "allow_credentials": True,
        "api_key": ["sk-cors"],
    }
    with serving(tmp_path, **args) as stack:
        stack.wait_ready()
        url = f"{stack.base_url}/v1/chat/completions"
        ok = preflight(url, "https://good.example", "POST", "authorization, content-type")
        assert (ok.status_code, ok.text) == (200, "OK")
        assert ok.headers["access-control-allow-origin"] == "https://good.example"
        assert ok.headers["access-control-allow-methods"] == "GET, POST"
        assert (
            ok.headers["access-control-allow-headers"]
            == "Accept, Accept-Language, Authorization, Content-Language, Content-Type"
        )
        assert ok.headers["access-control-allow-credentials"] == "true"
        assert ok.headers["access-control-max-age"] == "600"
        bad = preflight(url, "https://evil.example", "DELETE", "x-other")
        assert (bad.status_code, bad.text) == (400, "Disallowed CORS origin, method, headers")
        assert "access-control-allow-origin" not in bad.headers
        # A simple request from an allowed origin gets the origin back; the API key still applies.
        body = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        answer = httpx2.post(
            url, json=body, headers={"Origin": "https://good.example", "Authorization": "Bearer sk-cors"}
        )
        assert answer.status_code == 200, answer.text
        assert answer.headers["access-control-allow-origin"] == "https://good.example"
        assert answer.headers["access-control-allow-credentials"] == "true"
        assert answer.headers["vary"] == "Origin"
        other = httpx2.get(f"{stack.base_url}/health", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers and other.headers["vary"] == "Origin"


def test_cors_defaults_allow_no_origin_and_wildcard_allows_all(tmp_path):
    with serving(tmp_path) as stack:
        stack.wait_ready()
        refused = preflight(f"{stack.base_url}/v1/models", "https://any.example", "GET")
        assert (refused.status_code, refused.text) == (400, "Disallowed CORS origin")
    with serving(tmp_path, allowed_origins=["*"]) as stack:
        stack.wait_ready()
        allowed = preflight(f"{stack.base_url}/v1/models", "https://any.example", "GET", "x-anything")
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == "*"
        assert allowed.headers["access-control-allow-headers"] == "x-anything"
        simple = httpx2.get(f"{stack.base_url}/v1/models", headers={"Origin": "https://any.example"})
        assert simple.headers["access-control-allow-origin"] == "*"


def test_root_path_and_request_id_headers(tmp_path):
    with serving(tmp_path, root_path="/api", enable_request_id_headers=True) as stack:
        stack.wait_ready()
        under_root = openai.OpenAI(base_url=f"{stack.base_url}/api/v1", api_key="x", max_retries=0)
        assert [m.id for m in under_root.models.list().data] == ["echo"]
        assert [m.id for m in stack.client().models.list().data] == ["echo"]
        assert httpx2.get(f"{stack.base_url}/apiv1/models").status_code == 404
        echoed = httpx2.get(f"{stack.base_url}/api/health", headers={"X-Request-Id": "my-id-1"})
        assert (echoed.status_code, echoed.headers["x-request-id"]) == (200, "my-id-1")
        made_up = httpx2.get(f"{stack.base_url}/v1/models").headers["x-request-id"]
        assert len(made_up) == 32 and int(made_up, 16) >= 0
        assert httpx2.get(f"{stack.base_url}/no-such-route").headers["x-request-id"]
    with serving(tmp_path) as stack:
        stack.wait_ready()
        assert "x-request-id" not in httpx2.get(f"{stack.base_url}/health", headers={"X-Request-Id": "a"}).headers


def chat_prompt(stack, **kwargs) -> tuple[str, openai.types.chat.ChatCompletion]:
    """Sends one chat request; returns the prompt the engine received (as
    text: `echo` repeats it) and the answer."""
    answer = stack.client().chat.completions.create(
        model="echo", messages=[{"role": "user", "content": "hi"}], max_tokens=64, **kwargs
    )
    return answer.choices[0].message.content[: answer.usage.prompt_tokens], answer


def test_chat_template_file_and_inline_change_the_engine_prompt(tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")
    with serving(tmp_path, chat_template=str(template), response_role="bot") as stack:
        stack.wait_ready()
        prompt, answer = chat_prompt(stack)
        assert prompt == "<user>hi"
        assert answer.choices[0].message.role == "bot"
        streamed = stack.client().chat.completions.create(
            model="echo", messages=[{"role": "user", "content": "hi"}], max_tokens=1, stream=True
        )
        assert [c.choices[0].delta.role for c in streamed if c.choices][0] == "bot"
    inline = "{% for m in messages %}{% for p in m['content'] %}({{ p.text }}){% endfor %}{% endfor %}"
    with serving(tmp_path, chat_template=inline) as stack:
        stack.wait_ready()
        assert chat_prompt(stack)[0] == "(hi)", "auto detects the openai content format"
    with serving(tmp_path, chat_template="{{ messages[0].content }}!", chat_template_content_format="string") as stack:
        stack.wait_ready()
        assert chat_prompt(stack)[0] == "hi!"


def test_force_include_usage_ends_every_stream_with_usage(tmp_path):
    with serving(tmp_path, enable_force_include_usage=True) as stack:
        stack.wait_ready()
        chunks = list(stack.client().completions.create(model="echo", prompt="abc", max_tokens=2, stream=True))
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 2


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ({"ssl_keyfile": "/no/such/key.pem", "ssl_certfile": "/no/such/cert.pem"}, "ssl_"),
        ({"ssl_certfile": "/no/such/cert.pem"}, "ssl_certfile"),
        ({"ssl_ciphers": "ECDHE-RSA-AES256-GCM-SHA384"}, "ssl_ciphers"),
        ({"chat_template": "no-such-template.jinja"}, "chat_template"),
        ({"tool_call_parser": "no_such_parser", "enable_auto_tool_choice": True}, "tool_call_parser"),
        ({"enable_auto_tool_choice": True}, "tool_call_parser"),
    ],
)
def test_settings_that_cannot_be_honoured_exit_2_naming_the_key(tmp_path, args, named):
    with serving(tmp_path, start_engines=False, **args) as stack:
        proc = stack.frontend.processes[0]
        proc.join(timeout=30)
        assert proc.exitcode == 2, stack.frontend_log()
        assert named in stack.frontend_log() and "panicked" not in stack.frontend_log()
