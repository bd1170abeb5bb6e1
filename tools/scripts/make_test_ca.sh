#!/bin/sh
# Make a TEST certificate authority and two certificates signed by it, for OpenFlow over TLS:
#
#     tools/scripts/make_test_ca.sh DIR [NAME]
#
# writes into DIR (created if missing; existing files are replaced):
#     ca-cert.pem          the CA's certificate: what both sides trust (controller --ssl-ca, ovs-vsctl set-ssl CA)
#     ca-key.pem           the CA's private key (only needed to sign more certificates)
#     controller-key.pem   controller-cert.pem   the controller's key and certificate (--ssl-key, --ssl-cert)
#     switch-key.pem       switch-cert.pem       the switches' key and certificate (ovs-vsctl set-ssl KEY CERT CA)
#
# NAME (default "hpnlab test") goes into the subjects' common names, so two CAs made with different
# names are told apart in logs. EC P-256 keys, valid 30 days: for tests and trials, not for production
# (there, use your organisation's CA, or `ovs-pki` from Open vSwitch).
set -eu

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "usage: $0 DIR [NAME]" >&2
    exit 2
fi
dir=$1
name=${2:-hpnlab test}
command -v openssl >/dev/null 2>&1 || { echo "$0: openssl is not installed (apt-get install openssl)" >&2; exit 2; }
mkdir -p "$dir"
umask 077
days=30

key() {   # key FILE
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null
}

ext=$(mktemp)
trap 'rm -f "$ext" "$dir"/*.csr' EXIT

# the CA: self-signed, may sign certificates
key "$dir/ca-key.pem"
openssl req -x509 -new -key "$dir/ca-key.pem" -sha256 -days "$days" -subj "/O=hpnlab/CN=$name CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$dir/ca-cert.pem"

sign() {   # sign ROLE USAGE: ROLE-key.pem and ROLE-cert.pem signed by the CA
    key "$dir/$1-key.pem"
    openssl req -new -key "$dir/$1-key.pem" -subj "/O=hpnlab/CN=$name $1" -out "$dir/$1.csr"
    printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyAgreement\nextendedKeyUsage=%s\n%s\n' \
        "$2" "subjectAltName=IP:127.0.0.1,DNS:localhost" > "$ext"
    openssl x509 -req -in "$dir/$1.csr" -CA "$dir/ca-cert.pem" -CAkey "$dir/ca-key.pem" -CAcreateserial \
        -sha256 -days "$days" -extfile "$ext" -out "$dir/$1-cert.pem" 2>/dev/null
}

sign controller serverAuth,clientAuth
sign switch clientAuth,serverAuth
rm -f "$dir/ca-cert.srl"
chmod 644 "$dir"/*-cert.pem
echo "test CA '$name' in $dir: ca-cert.pem, controller-{key,cert}.pem, switch-{key,cert}.pem"
