"""A stream's ledger: which request each response first answers (`gateway.streams`)."""

from __future__ import annotations

from tritonclient.grpc import service_pb2

from seedance.router.gateway.streams import StreamLedger, StreamRequest


def _request(request_id: str, arrival_s: float = 0.0) -> StreamRequest:
    return StreamRequest(model="llm", request_id=request_id, arrival_s=arrival_s)


def _response(request_id: str, error: str = "") -> service_pb2.ModelStreamInferResponse:
    return service_pb2.ModelStreamInferResponse(
        error_message=error, infer_response=service_pb2.ModelInferResponse(id=request_id)
    )


def _answer(ledger: StreamLedger, response: service_pb2.ModelStreamInferResponse) -> object:
    """(request id, arrival, status class) of the request `response` first answers, or None."""
    answered = ledger.answer(response)
    if answered is None:
        return None
    request, status = answered
    return request.request_id, request.arrival_s, status


def test_a_response_answers_the_request_with_its_id_once() -> None:
    ledger = StreamLedger()
    for rid in ("a", "b"):
        ledger.sent(_request(rid))
    assert _answer(ledger, _response("b")) == ("b", 0.0, "ok")
    # b's later tokens are not new outcomes
    assert _answer(ledger, _response("b")) is None
    assert _answer(ledger, _response("a")) == ("a", 0.0, "ok")
    assert len(ledger) == 0


def test_responses_without_an_id_answer_the_oldest_request_without_one() -> None:
    ledger = StreamLedger()
    ledger.sent(_request("", 1.0))
    ledger.sent(_request("x", 2.0))
    ledger.sent(_request("", 3.0))
    assert _answer(ledger, _response("")) == ("", 1.0, "ok")
    assert _answer(ledger, _response("")) == ("", 3.0, "ok")
    assert [r.request_id for r in ledger.unanswered()] == ["x"]
    assert ledger.unanswered() == []


def test_an_error_inside_a_stream_is_a_server_error() -> None:
    # Triton sends an in-stream error's message only, no status code: a malformed request and
    # a failed model look alike, so it is counted as a miss.
    ledger = StreamLedger()
    ledger.sent(_request("bad"))
    error = _response("bad", error="[request id: bad] expected 3 inputs")
    assert _answer(ledger, error) == ("bad", 0.0, "server_error")


def test_a_response_to_no_pending_request_is_ignored() -> None:
    ledger = StreamLedger()
    ledger.sent(_request("a"))
    assert ledger.answer(_response("zzz")) is None
    assert ledger.answer(_response("")) is None
    assert len(ledger) == 1


def _final(request_id: str) -> service_pb2.ModelStreamInferResponse:
    response = _response(request_id)
    response.infer_response.parameters["triton_final_response"].bool_param = True
    return response


def test_an_id_is_held_until_a_response_to_it_is_flagged_final() -> None:
    ledger = StreamLedger()
    ledger.sent(_request("x"))
    assert ledger.reuse_refusal("y") is None
    assert _answer(ledger, _response("x")) == ("x", 0.0, "ok")
    # answered, but its later tokens would still carry "x": a second "x" is refused
    refusal = ledger.reuse_refusal("x")
    assert refusal is not None
    assert "'x'" in refusal
    assert _answer(ledger, _final("x")) is None  # its last token: no new outcome
    assert ledger.reuse_refusal("x") is None
    ledger.sent(_request("x", 5.0))
    assert _answer(ledger, _final("x")) == ("x", 5.0, "ok")


def test_a_final_flag_set_false_holds_the_id_and_id_less_requests_are_never_held() -> None:
    ledger = StreamLedger()
    ledger.sent(_request("x"))
    not_final = _response("x")
    not_final.infer_response.parameters["triton_final_response"].bool_param = False
    ledger.answer(not_final)
    assert ledger.reuse_refusal("x") is not None
    ledger.sent(_request(""))
    ledger.sent(_request(""))
    assert ledger.reuse_refusal("") is None  # matched by order, as before
