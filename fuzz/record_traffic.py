"""Records what real clients send: a TCP relay in front of a proxy that writes each
connection's client-to-server bytes to OUT_DIR/<n>.bin (see seed_corpora.sh).

usage: record_traffic.py LISTEN_PORT UPSTREAM_PORT OUT_DIR
"""
import os
import socket
import sys
import threading

listen_port, upstream_port, out_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
os.makedirs(out_dir, exist_ok=True)
counter = iter(range(1_000_000))
lock = threading.Lock()


def pump(src, dst, record):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            if record is not None:
                record.write(data)
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def serve(client):
    with lock:
        n = next(counter)
    upstream = socket.create_connection(("127.0.0.1", upstream_port))
    with open(os.path.join(out_dir, f"{n:05}.bin"), "wb") as record:
        back = threading.Thread(target=pump, args=(upstream, client, None), daemon=True)
        back.start()
        pump(client, upstream, record)
        back.join()


server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", listen_port))
server.listen(64)
while True:
    conn, _ = server.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
