'use strict';
// Warm reads through keychaind from Node, as `keychain-bench --daemon-concurrent-reads CLIENTS READS` measures
// Swift's library: keychaind on a private swtpm (KEYCHAIN_BIN's), a 32-byte secret written once as `bench`'s
// `k0`, 3,000 reads to warm V8's compiler, then CLIENTS concurrent loops of this process × READS getItem each, every value checked; and one
// client's READS reads one after another. Usage: node bench/warm-read.js [CLIENTS] [READS]   (default 16 1000)

const { startDaemon } = require('../test/support/daemon');

async function main() {
  const clients = Number(process.argv[2] ?? 16), reads = Number(process.argv[3] ?? 1000);
  const daemon = await startDaemon({ reader: false });
  try {
    process.env.KEYCHAIN_SOCKET = daemon.socket;
    const { createKeychain } = require('..');
    const storage = createKeychain({ service: 'bench' });
    const secret = 's'.repeat(32);
    await storage.setItem('k0', secret);
    if (await storage.getItem('k0') !== secret) throw new Error('the daemon returned another value');
    const run = async (loops) => {
      const times = [];
      let errors = 0;
      const start = process.hrtime.bigint();
      await Promise.all(Array.from({ length: loops }, async () => {
        for (let i = 0; i < reads; i++) {
          const t = process.hrtime.bigint();
          try {
            if (await storage.getItem('k0') !== secret) errors++;
          } catch {
            errors++;
          }
          times.push(Number(process.hrtime.bigint() - t));
        }
      }));
      const elapsed = Number(process.hrtime.bigint() - start) / 1e9;
      times.sort((a, b) => a - b);
      const at = (q) => (times[Math.min(times.length - 1, Math.floor(q * times.length))] / 1e6).toFixed(2);
      return `${loops} client${loops === 1 ? '' : 's'} × ${reads} warm reads through keychaind: ${Math.round(times.length / elapsed)} `
        + `reads/s aggregate, p50 ${at(0.5)} ms, p99 ${at(0.99)} ms, ${errors} errors`;
    };
    // V8 compiles the read path as it runs: the first thousand reads are slower (5,500/s, then 11,000–13,700/s,
    // one client on the loaded machine). The Swift bench's code is compiled ahead; so are these reads, after this.
    for (let i = 0; i < 3000; i++) await storage.getItem('k0');
    console.log(`node ${process.version}`);
    console.log(await run(1));
    console.log(await run(clients));
  } finally {
    await daemon.stop();
  }
}

main().catch((error) => { console.error(error); process.exit(1); });
