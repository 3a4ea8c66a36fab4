#!/usr/bin/env bash
# Installs what the VM defaults (issue 6) need from Debian, when missing: libvirt's headers to
# build against, the QEMU driver libvirt embeds, and QEMU for amd64 and arm64 guests (about
# 40 s the first time, instant after). As root, libvirt's QEMU driver also needs the system
# user libvirt-qemu.
set -euo pipefail
# qemu-system-arm and qemu-efi-aarch64: arm64 guests (TCG), as KubeVirt's arm64 nodes run them.
pkgs=(libvirt-dev pkg-config libvirt-daemon-driver-qemu qemu-system-x86 qemu-system-arm qemu-efi-aarch64)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
sudo=""
[ "$(id -u)" = 0 ] || sudo=sudo
if ((${#missing[@]})); then
  echo "== apt-get install ${missing[*]}" >&2
  $sudo apt-get update -q >&2
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi
if [ "$(id -u)" = 0 ] && ! getent passwd libvirt-qemu >/dev/null; then
  useradd --system --no-create-home --shell /usr/sbin/nologin libvirt-qemu
fi
