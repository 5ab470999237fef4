'use strict';
// The application's identifier, the seed's default service, found as the Swift library finds it
// (Sources/Keychain/ApplicationIdentity.swift): KEYCHAIN_APP_ID; else the systemd unit the process
// runs in (a desktop application's app-….service/.scope, or a service's name); else the desktop file
// GLib launched. A program run by hand from a shell has none.

const fs = require('node:fs');

function unescaped(text) {
  return Buffer.from(text.replace(/\\x([0-9a-fA-F]{2})/g, (_, hex) => String.fromCharCode(parseInt(hex, 16))), 'latin1')
    .toString('utf8');
}

function application(unit) {
  const isScope = unit.endsWith('.scope');
  let name = unit.slice(0, -(isScope ? '.scope'.length : '.service'.length));
  if (name.startsWith('app-')) {
    name = name.slice('app-'.length);
    if (isScope) {
      const random = name.lastIndexOf('-');
      if (random < 0) return undefined;
      name = name.slice(0, random);
    } else if (name.includes('@')) {
      name = name.slice(0, name.indexOf('@'));
    }
    // The id's own dashes are escaped (\x2d): a dash left separates the launcher.
    if (name.includes('-')) name = name.slice(name.indexOf('-') + 1);
    return unescaped(name) || undefined;
  }
  if (isScope || name.startsWith('user@') || name.startsWith('user-runtime-dir@')) return undefined;
  return unescaped(name) || undefined;
}

function unitApplication(cgroup) {
  for (const line of cgroup.split('\n')) {
    const fields = line.split(':');
    if (fields.length < 3) continue;
    const [hierarchy, controllers] = fields;
    if (!((hierarchy === '0' && controllers === '') || controllers === 'name=systemd')) continue;
    const unit = fields.slice(2).join(':').split('/').filter((p) => p.endsWith('.service') || p.endsWith('.scope')).pop();
    if (unit) return application(unit);
  }
  return undefined;
}

function applicationIdentifier(env = process.env) {
  if (env.KEYCHAIN_APP_ID) return env.KEYCHAIN_APP_ID;
  let cgroup;
  try { cgroup = fs.readFileSync('/proc/self/cgroup', 'utf8'); } catch { /* not Linux, or no /proc */ }
  const fromUnit = cgroup && unitApplication(cgroup);
  if (fromUnit) return fromUnit;
  const desktop = env.GIO_LAUNCHED_DESKTOP_FILE?.split('/').pop();
  if (desktop?.endsWith('.desktop') && desktop.length > '.desktop'.length) return desktop.slice(0, -'.desktop'.length);
  return undefined;
}

module.exports = { applicationIdentifier };
