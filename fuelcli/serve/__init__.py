"""`fuel serve`: an OpenAI-compatible HTTP server over one engine (starlette on uvicorn).

    schemas.py   the request bodies (pydantic), checked strictly; errors in OpenAI's shape (errors.py)
    jobs.py      a checked request -> a Job: prompt ids, sampler, stops, logprobs
    worker.py    the engine thread: a bounded queue, one job at a time, the prompt (prefix) cache
    logprobs.py  per-token log-probabilities and token bytes
    responses.py OpenAI response bodies and stream chunks; sse.py frames them as server-sent events
    openai_api.py  the OpenAI routes' handlers; request_io.py reads bodies and waits for answers
    app.py       the route table, auth and error handling; server.py binds and runs uvicorn
"""
