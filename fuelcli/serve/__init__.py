"""`fuel serve`: an OpenAI- and Anthropic-compatible HTTP server over one engine (starlette on uvicorn).

    schemas.py        the OpenAI request bodies (pydantic), checked strictly; errors in OpenAI's shape (errors.py)
    anthropic_schemas.py, responses_api_schemas.py  Anthropic's and the Responses API's request
                      bodies, checked, translated to a chat request
    jobs.py           a checked request -> a Job: prompt ids, sampler, stops, logprobs
    worker.py         the engine thread: a bounded queue, the slots, the prompt (prefix) cache
    reply.py, tools.py    a reply read back: reasoning, content, tool calls (json_check.py: a bare call's arguments)
    logprobs.py       per-token log-probabilities and token bytes
    responses.py      OpenAI chat and completion bodies and stream chunks; anthropic_format.py and
                      responses_api_format.py the other APIs'
    sse.py            a job's events as server-sent events, framed per API
    openai_api.py, anthropic_api.py, responses_api.py  the routes' handlers (responses_api.py keeps
                      the responses for previous_response_id); request_io.py reads bodies and answers jobs
    app.py            the route table, auth and error handling; server.py binds and runs uvicorn
"""
