'use strict';
// The bytes this package sends are the bytes the protocol pinned: the request of each call and each
// prompt answer, compared with the hex strings of Tests/KeychainTests/WireGoldenTests.swift (read
// from that file, so the two suites cannot drift apart), recorded by a socket that stands in for keychaind.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const { repository } = require('./support/daemon');
const keychain = require('..');
const { MessageBuilder, Message, Kind, Tag } = require('../lib/wire');

/** The Swift test's pinned strings: `requestOptions`, `answerOptions`, `golden`, `goldenAnswers`, `goldenPrompt`. */
function swiftGolden() {
  const source = fs.readFileSync(path.join(repository, 'Tests/KeychainTests/WireGoldenTests.swift'), 'utf8');
  const constant = (name) => source.match(new RegExp(`static let ${name} = "([0-9a-f]+)"`))[1];
  const table = (name, o) => {
    const body = source.match(new RegExp(`static let ${name}: \\[String: \\[String\\]\\] = \\{([\\s\\S]*?)\\}\\(\\)`))[1];
    const entries = {};
    for (const [, key, list] of body.matchAll(/"(\w+)": \[(.*)\],/g)) {
      entries[key] = list.split(',').map((element) => element.split('+').map((part) => {
        part = part.trim();
        return part === 'o' ? o : part.replace(/^"|"$/g, '');
      }).join(''));
    }
    return entries;
  };
  return {
    requests: table('golden', constant('requestOptions')),
    answers: table('goldenAnswers', constant('answerOptions')),
    prompt: constant('goldenPrompt'),
  };
}

/** A socket that records each frame a client sends; `reply(message)` says what it answers. */
async function recorder(reply) {
  const directory = fs.mkdtempSync(path.join(os.tmpdir(), 'keychain-node-golden-'));
  const socket = path.join(directory, 'golden.sock');
  const frames = [], connections = [];
  const server = net.createServer((connection) => {
    connections.push(connection);
    let buffer = Buffer.alloc(0);
    connection.on('data', (chunk) => {
      buffer = Buffer.concat([buffer, chunk]);
      while (buffer.length >= 4 && buffer.length >= 4 + buffer.readUInt32BE(0)) {
        const frame = buffer.subarray(4, 4 + buffer.readUInt32BE(0));
        buffer = buffer.subarray(4 + frame.length);
        frames.push(frame.toString('hex'));
        connection.write(reply(Message.decode(frame)).encode(true));
      }
    });
    connection.on('error', () => {});
  });
  await new Promise((resolve) => server.listen(socket, resolve));
  return {
    socket,
    take: () => frames.splice(0),
    close: () => new Promise((resolve) => {
      for (const connection of connections) connection.destroy();
      server.close(() => { fs.rmSync(directory, { recursive: true, force: true }); resolve(); });
    }),
  };
}

const refusal = () => new MessageBuilder(Kind.error).string(Tag.errorCode, 'INTERNAL').string(Tag.errorMessage, 'recorded');
const golden = swiftGolden();

test('each call sends the bytes the protocol pinned', async (t) => {
  const recording = await recorder(refusal);
  t.after(() => recording.close());
  process.env.KEYCHAIN_SOCKET = recording.socket;
  keychain.setPromptHandler(null);
  t.after(() => keychain.setPromptHandler(undefined));
  const mail = keychain.createKeychain({ service: 'mail', accessGroup: 'team', prompt: { title: 'Mail' } });
  const calls = {
    setItem: () => mail.setItem('token', 'v', { accessible: 'always', accessControl: 'passcode', authValidity: 5, label: 'L',
      synchronizable: false }),
    setItemPlain: () => mail.setItem('token', 'v'),
    getItem: () => mail.getItem('token', { prompt: { subtitle: 'for the mail' } }),
    hasItem: () => mail.hasItem('token'),
    removeItem: () => mail.removeItem('token'),
    clear: () => mail.clear(),
    allKeys: () => mail.getAllKeys(),
    itemInfo: () => mail.getItemInfo('token'),
    storageCanUse: () => mail.canUseAccessControl('biometryAny'),
    endWindows: () => mail.endAuthenticationWindow(),
    biometryTypes: () => keychain.getBiometryTypes(),
    deviceCanUse: () => keychain.canUseAccessControl('passcode'),
  };
  for (const [name, call] of Object.entries(calls)) {
    await assert.rejects(call(), { code: 'INTERNAL', message: 'recorded' });
    assert.deepEqual(recording.take(), golden.requests[name], name);
  }
  // The calls of the device's administration (passcode, fingers, init, status…) are keychainctl's, not the seed's API.
  assert.equal(Object.keys(calls).filter((name) => golden.requests[name]).length, 12);
});

test('each prompt answer is the bytes the protocol pinned, and the handler is asked what keychaind asked', async (t) => {
  const prompt = Message.decode(Buffer.from(golden.prompt, 'hex'));
  const recording = await recorder((message) => (message.kind === 2 ? { encode: (framed) => framedCopy(golden.prompt, framed) } : refusal()));
  t.after(() => recording.close());
  process.env.KEYCHAIN_SOCKET = recording.socket;
  t.after(() => keychain.setPromptHandler(undefined));
  const mail = keychain.createKeychain({ service: 'mail' });
  const answers = { finger: { finger: 'thumb' }, passcode: { passcode: '1234' }, cancel: 'cancel', fallback: 'fallback',
    interrupted: 'interrupted', unavailable: { unavailable: 'no terminal' } };
  assert.equal(prompt.kind, Kind.prompt);
  for (const [name, answer] of Object.entries(answers)) {
    const asked = [];
    keychain.setPromptHandler((request) => { asked.push(request); return answer; }, { attemptsPerRead: 2 });
    await assert.rejects(mail.getItem('token'), { code: 'INTERNAL' });
    assert.deepEqual(recording.take(), golden.answers[name], name);
    assert.equal(asked.length, 1);
    const { title, cancel, methods, service, key, attempt, previousFailure } = asked[0];
    assert.deepEqual({ title, cancel, methods, service, key, attempt, previousFailure },
      { title: 'T', cancel: 'C', methods: ['fingerprint', 'passcode'], service: 'mail', key: 'token', attempt: 2, previousFailure: 'no match' });
  }
});

function framedCopy(hex, framed) {
  const body = Buffer.from(hex, 'hex');
  if (!framed) return body;
  const frame = Buffer.alloc(4 + body.length);
  frame.writeUInt32BE(body.length, 0);
  body.copy(frame, 4);
  return frame;
}

test('a storage naming no service says so, so that keychaind gives a confined caller its application id', async (t) => {
  const recording = await recorder(refusal);
  t.after(() => recording.close());
  process.env.KEYCHAIN_SOCKET = recording.socket;
  process.env.KEYCHAIN_APP_ID = 'org.example.App';
  t.after(() => { delete process.env.KEYCHAIN_APP_ID; });
  keychain.setPromptHandler(null);
  t.after(() => keychain.setPromptHandler(undefined));
  for (const storage of [keychain.createKeychain({}), keychain.createKeychain({ service: 'mail' })]) {
    await assert.rejects(storage.hasItem('token'), { code: 'INTERNAL', message: 'recorded' });
  }
  const options = recording.take().map((frame) => Message.decode(Message.decode(Buffer.from(frame, 'hex')).bytes(Tag.options)));
  assert.deepEqual(options.map((o) => o.string(1)), ['org.example.App', 'mail']);
  assert.deepEqual(options.map((o) => o.bool(9)), [true, undefined], 'serviceIsDefault only where no service was named');
});
