'use strict';
// Kept connections and a keychaind that goes away: a connection keychaind closed while it was kept
// (its idle timeout) costs the next call nothing, and a keychaind that ends during a call is
// HARDWARE_UNAVAILABLE saying the call may or may not have taken effect, never a hang.

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { startDaemon } = require('./support/daemon');
const { AccessControl, createKeychain, setPromptHandler } = require('..');

describe('connections to keychaind', () => {
  let daemon;
  before(async () => {
    daemon = await startDaemon({ reader: false, args: ['--idle-timeout', '1'] });
    process.env.KEYCHAIN_SOCKET = daemon.socket;
  });
  after(async () => {
    setPromptHandler(undefined);
    await daemon?.stop();
  });

  it('reads on after keychaind closed the kept connections at its idle timeout', async () => {
    const storage = createKeychain({ service: 'node.kept' });
    await Promise.all(Array.from({ length: 8 }, (_, i) => storage.setItem(`k${i}`, `v${i}`)));
    for (let round = 0; round < 2; round++) {
      // Past keychaind's idle timeout (1 s): every kept connection is closed by now.
      await new Promise((resolve) => setTimeout(resolve, 2500));
      const values = await Promise.all(Array.from({ length: 8 }, (_, i) => storage.getItem(`k${i}`)));
      assert.deepEqual(values, Array.from({ length: 8 }, (_, i) => `v${i}`));
    }
  });

  it('says keychaind stopped during the call when it ends while the user is asked', async () => {
    const vault = createKeychain({ service: 'node.stopped', accessControl: AccessControl.Passcode });
    await vault.setItem('t', 'v');
    setPromptHandler(async () => {
      await daemon.kill();
      return { passcode: daemon.passcode };
    });
    await assert.rejects(vault.getItem('t'), {
      code: 'HARDWARE_UNAVAILABLE',
      message: `The keychain service stopped during the call (${daemon.socket}): the call may or may not have taken effect; check and retry`,
    });
    await assert.rejects(vault.hasItem('t'), { code: 'HARDWARE_UNAVAILABLE', message: /^The keychain service is not running/ });
  });
});
