#!/usr/bin/env bash
# Makes a throwaway CA, a server certificate for 127.0.0.1/localhost and a client certificate
# in DIR (ca.pem, server.pem/.key, client.pem/.key), for tests of TLS (Redis, HTTPS).
set -euo pipefail
dir="$1"
mkdir -p "$dir"
cd "$dir"
q() { openssl "$@" >/dev/null 2>&1; }
q req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=tandem test CA" -keyout ca.key -out ca.pem
for who in server client; do
  q req -newkey rsa:2048 -nodes -subj "/CN=tandem test $who" -keyout "$who.key" -out "$who.csr"
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=%s\n' \
    "$([ "$who" = server ] && echo serverAuth || echo clientAuth)" > "$who.ext"
  q x509 -req -in "$who.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
    -extfile "$who.ext" -out "$who.pem"
done
ls ca.pem server.pem server.key client.pem client.key >/dev/null
