"""The HTTP ingress: routes client requests to replicas and streams the answers back.

Built on ``asyncio.Protocol`` and httptools rather than a web framework, because the proxy sits on
every request: a framework server forwarding through a framework client costs two full request
objects, a task and several buffers per request. Here a request costs one
:class:`.exchange.Exchange` and the bytes it carries. The tricks, each marked where it is used:

* **Synchronous fast path**: routing, the replica choice (``Router.try_assign``) and taking a pooled
  upstream connection happen inside ``data_received``; a task exists only when a request must wait
  for a slot or a new connection.
* **Verbatim messages**: a request or response that arrives whole in one read and needs no change
  (no hop-by-hop header to drop, HTTP/1.1 keep-alive on both sides) is forwarded as the very bytes
  read, one ``write``; its head is never re-serialized. httptools still parses every byte, so what
  is forwarded is exactly the one message we parsed.
* **Bytes through** otherwise: the request line, headers and body are forwarded as the pieces
  httptools hands us; only hop-by-hop headers are dropped and chunked bodies re-framed piece by
  piece (never buffered whole).
* **Write coalescing**: everything one ``data_received`` produces for the other side goes out in one
  ``writelines`` (one syscall), e.g. head and body of a small response together.
* **Pooled keep-alive upstream connections**, per replica, LIFO so the warmest is reused; to a
  replica on the same host over its unix socket (:mod:`~kubeserve.runtime.local_socket`), which
  costs the kernel much less per request than loopback TCP.
* **Backpressure both ways**: a side whose write buffer fills pauses reading on the other side.
* **Lazy connection timer**: one timer per client connection that re-arms itself, instead of
  cancelling and creating a timer per request. It enforces the keep-alive timeout and the request
  head and body timeouts of :class:`~kubeserve.runtime.limits.RequestLimits`; a read that leaves a
  request incomplete notes the time (a whole request in one read never does).

Hostile input: heads, URLs and bodies are bounded by :class:`~kubeserve.runtime.limits.
RequestLimits` (408, 413, 414, 431); what is buffered per connection is bounded by them too.
Routing uses the normalised path (:func:`~kubeserve.control.routes.normalize_path`), the one the
replica's user code sees, so no spelling of a path reaches another route or the proxy's ``/-/``
endpoints; only paths holding ``%``, ``/.`` or ``//`` pay for it, and the route memo keys on the
raw path. Every response carries ``x-request-id``: the client's, or one the proxy generated and
added to the forwarded request.

Layout (as uvicorn splits its httptools protocol, flow control and server):

* :mod:`.state`: :class:`ProxyState`, what all connections share (routes, router, upstream pools);
* :mod:`.client`: the client connection, parsing requests on the connection base shared with the
  replica server (:mod:`~kubeserve.runtime.http_connection`);
* :mod:`.exchange`: one request from its first byte to the last byte of its answer;
* :mod:`.upstream`: the connection to a replica, parsing its responses;
* :mod:`.tunnel`: a WebSocket, the client and replica connections spliced after the replica's 101;
* :mod:`.server`: :class:`ProxyServer` and :func:`serve_proxy`;
* :mod:`.command`: ``kubeserve proxy`` (also ``python -m kubeserve.runtime.proxy``).

Ownership: a client connection owns its exchanges (the one being forwarded and any pipelined
behind it); an exchange owns its router slot and its upstream connection until it hands it back to
the pool. :class:`ProxyState` owns the route table, the router and the pools; discovery replaces
them.
"""

from kubeserve.runtime.proxy.command import main
from kubeserve.runtime.proxy.server import ProxyServer, serve_proxy
from kubeserve.runtime.proxy.state import ProxyState

__all__ = ["ProxyServer", "ProxyState", "main", "serve_proxy"]
