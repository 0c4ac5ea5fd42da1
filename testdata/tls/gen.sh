#!/bin/sh
# Regenerates the TEST-ONLY TLS material of tests/http and the benchmark receiver: a CA, a
# server certificate for localhost and 127.0.0.1 signed by it, and an unrelated second CA.
# Valid for 100 years. Run from anywhere: ./testdata/tls/gen.sh
set -eu
cd "$(dirname "$0")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ca() { # name subject
    openssl ecparam -name prime256v1 -genkey -noout -out "$tmp/$1.key"
    openssl req -x509 -new -key "$tmp/$1.key" -sha256 -days 36500 -subj "/CN=$2" \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" -out "$1.pem"
}
ca ca "keyorder test CA"
ca other-ca "keyorder unrelated test CA"

openssl ecparam -name prime256v1 -genkey -noout -out "$tmp/server.ec"
openssl pkcs8 -topk8 -nocrypt -in "$tmp/server.ec" -out server.key
openssl req -new -key server.key -subj "/CN=localhost" -out "$tmp/server.csr"
cat > "$tmp/ext" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=DNS:localhost,IP:127.0.0.1
EXT
openssl x509 -req -in "$tmp/server.csr" -CA ca.pem -CAkey "$tmp/ca.key" -CAcreateserial \
    -CAserial "$tmp/ca.srl" -sha256 -days 36500 -extfile "$tmp/ext" -out server.pem
echo "wrote ca.pem other-ca.pem server.pem server.key"
