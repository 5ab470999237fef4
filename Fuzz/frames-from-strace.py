#!/usr/bin/env python3
# Seeds for the frame and request targets from a real session: run keychaind on a swtpm, then each keychainctl
# command under `strace -f -xx -s 70000 -e trace=write,sendto,sendmsg,read,recvfrom,recvmsg,connect -o LOG`
# with KEYCHAIN_SOCKET=.../k.sock, and: Fuzz/frames-from-strace.py Fuzz/corpus/frame Fuzz/corpus/request LOG...
import re, sys, os, hashlib
out_frame, out_request = sys.argv[1], sys.argv[2]
os.makedirs(out_frame, exist_ok=True); os.makedirs(out_request, exist_ok=True)
def keep(d, data):
    open(os.path.join(d, hashlib.sha1(data).hexdigest()[:16]), 'wb').write(data)
for log in sys.argv[3:]:
    fd = None; sent = b''; received = b''
    for line in open(log):
        m = re.match(r'\d+ connect\((\d+), \{sa_family=AF_UNIX, sun_path="([^"]*)"', line)
        if m and bytes.fromhex(m.group(2).replace('\\x', '')).endswith(b'k.sock'): fd = m.group(1); continue
        m = re.match(r'\d+ (sendto|write|sendmsg|read|recvfrom)\((\d+), (?:\{msg_name=NULL, msg_namelen=0, msg_iov=\[\{iov_base=)?"([^"]*)"', line)
        if not m or m.group(2) != fd: continue
        data = bytes.fromhex(m.group(3).replace('\\x', ''))
        if m.group(1) in ('sendto', 'write', 'sendmsg'): sent += data
        else:
            n = int(re.search(r'= (-?\d+)', line).group(1)); received += data[:max(n, 0)]
    for stream in (sent, received):
        if not stream: continue
        keep(out_frame, stream)
        at = 0
        while at + 4 <= len(stream):
            n = int.from_bytes(stream[at:at+4], 'big'); keep(out_request, stream[at+4:at+4+n]); at += 4 + n
