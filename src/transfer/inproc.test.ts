/** Runs the transfer conformance suite (conformance.ts) against the inproc backend. */
import { transferConformance } from './conformance.ts';

transferConformance('inproc');
