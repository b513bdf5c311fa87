"""fake_redis — a Redis that misbehaves on command, for the remote tier's tests.

It speaks enough RESP2 for kvshared's remote tier (PING, AUTH, SELECT, SET
with PX, GET, anything else an error) on a Unix socket, one thread per
connection, and keeps SET values in a dict.  Its `mode` decides how the
next GET is answered:

  normal       the value, or nil
  unsolicited  the answer, then a "+OK" nobody asked for
  huge_array   "*2147483647" and nothing more
  huge_bulk    "$1500000000" then bytes for as long as the peer reads
  stall_bulk   "$99999999999" and nothing more
  stall_value  the value's true header and its first 10 bytes, then nothing
  garbage      "HTTP/1.1 400 Bad Request"

With `once` set, the mode goes back to normal after one GET.  A connection
left hanging by a mode stays open until the peer closes it or the server
stops.  Counts: gets, sets, connections.
"""
import socket
import threading


class FakeRedis:
    def __init__(self, path):
        self.path = path
        self.store = {}
        self.mode = "normal"
        self.once = False
        self.gets = self.sets = self.connections = 0
        self.lock = threading.Lock()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(64)
        self.conns = []
        self.stopping = False
        threading.Thread(target=self._accept, daemon=True).start()

    def stop(self):
        self.stopping = True
        self.sock.close()
        for c in list(self.conns):
            try:
                c.shutdown(socket.SHUT_RDWR)
                c.close()
            except OSError:
                pass

    def set_mode(self, mode, once=True):
        with self.lock:
            self.mode, self.once = mode, once

    def _accept(self):
        while not self.stopping:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
                self.conns.append(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _take_mode(self):
        with self.lock:
            m = self.mode
            if self.once:
                self.mode = "normal"
            return m

    def _serve(self, c):
        buf = bytearray()
        try:
            while True:
                cmd, buf = self._read_command(c, buf)
                if cmd is None:
                    return
                if not self._answer(c, cmd):
                    self._hang(c)
                    return
        except OSError:
            pass
        finally:
            try:
                c.close()
            except OSError:
                pass

    def _hang(self, c):
        """Keeps the connection open, reading nothing, until the peer goes."""
        try:
            while c.recv(65536):
                pass
        except OSError:
            pass

    @staticmethod
    def _read_command(c, buf):
        def need(n):
            while len(buf) < n:
                d = c.recv(1 << 20)
                if not d:
                    raise EOFError
                buf.extend(d)

        def line():
            while True:
                i = buf.find(b"\r\n")
                if i >= 0:
                    s = bytes(buf[:i])
                    del buf[: i + 2]
                    return s
                d = c.recv(1 << 20)
                if not d:
                    raise EOFError
                buf.extend(d)

        try:
            head = line()
            if not head.startswith(b"*"):
                return None, buf
            args = []
            for _ in range(int(head[1:])):
                n = int(line()[1:])
                need(n + 2)
                args.append(bytes(buf[:n]))
                del buf[: n + 2]
            return args, buf
        except (EOFError, ValueError):
            return None, buf

    def _answer(self, c, cmd):
        name = cmd[0].upper()
        if name == b"PING":
            c.sendall(b"+PONG\r\n")
        elif name in (b"AUTH", b"SELECT"):
            c.sendall(b"+OK\r\n")
        elif name == b"SET":
            with self.lock:
                self.store[cmd[1]] = cmd[2]
                self.sets += 1
            c.sendall(b"+OK\r\n")
        elif name == b"GET":
            with self.lock:
                v = self.store.get(cmd[1])
                self.gets += 1
            return self._get(c, v, self._take_mode())
        else:
            c.sendall(b"-ERR unknown command\r\n")
        return True

    def _get(self, c, v, mode):
        """Answers a GET in mode; False: the connection is left hanging."""
        answer = b"$-1\r\n" if v is None else b"$%d\r\n%s\r\n" % (len(v), v)
        if mode == "normal":
            c.sendall(answer)
        elif mode == "unsolicited":
            c.sendall(answer + b"+OK\r\n")
        elif mode == "huge_array":
            c.sendall(b"*2147483647\r\n")
            return False
        elif mode == "huge_bulk":
            c.sendall(b"$1500000000\r\n")
            chunk = b"x" * (1 << 20)
            try:
                for _ in range(1500):
                    c.sendall(chunk)
            except OSError:
                pass
            return False
        elif mode == "stall_bulk":
            c.sendall(b"$99999999999\r\n")
            return False
        elif mode == "stall_value":
            n = 0 if v is None else len(v)
            c.sendall(b"$%d\r\n" % n + (v or b"")[:10])
            return False
        elif mode == "garbage":
            c.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            return False
        return True
