"""Splits recorded client streams (record_traffic.py) into seed corpora: the startup
packet's body (startup/), the tagged messages after it (frames/), the SQL of every
Query and Parse (sql/), and each SASL exchange (scram/: client-first, a 0 byte,
client-final). Names are content hashes, so re-running adds only new inputs.

usage: split_traffic.py RECORDED_DIR CORPUS_DIR
"""
import hashlib
import os
import struct
import sys

recorded, corpus = sys.argv[1], sys.argv[2]


def save(target, data):
    if not data:
        return
    d = os.path.join(corpus, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, hashlib.sha1(data).hexdigest()[:16]), "wb") as f:
        f.write(data)


for name in sorted(os.listdir(recorded)):
    data = open(os.path.join(recorded, name), "rb").read()
    pos = 0
    # Untagged startup-phase packets: SSLRequest / GSSENCRequest answered "N", then the
    # StartupMessage (or a lone CancelRequest).
    while pos + 8 <= len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        body = data[pos + 4 : pos + length]
        save("startup", body)
        pos += length
        code = struct.unpack(">I", body[:4])[0]
        if code not in (80877103, 80877104):
            break
    rest = data[pos:]
    save("frames", rest)
    sasl_first = None
    while len(rest) >= 5:
        tag = rest[0:1]
        (length,) = struct.unpack(">I", rest[1:5])
        body = rest[5 : 1 + length]
        rest = rest[1 + length :]
        if tag == b"Q":
            save("sql", body.rstrip(b"\0"))
        elif tag == b"P":
            _, _, after = body.partition(b"\0")
            save("sql", after.partition(b"\0")[0])
        elif tag == b"p" and sasl_first is None and b"SCRAM" in body[:20]:
            mech_end = body.index(b"\0")
            sasl_first = body[mech_end + 5 :]
        elif tag == b"p" and sasl_first is not None:
            save("scram", sasl_first + b"\0" + body)
            sasl_first = None
