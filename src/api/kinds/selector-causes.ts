/** A LabelSelector field refused as the API server refuses it: an unknown operator, or a selector that does not parse. */
import type { Cause } from '../errors.js';
import { parseLabelSelector } from '../selectors.js';
import { isObj } from './common.js';
import { selectorString } from './workload-rows.js';

export function labelSelectorCauses(sel: unknown, field: string): Cause[] {
  if (!isObj(sel)) return [{ reason: 'FieldValueTypeInvalid', field, message: 'Invalid value: must be a label selector' }];
  if (Array.isArray(sel.matchExpressions)) {
    for (const [i, e] of sel.matchExpressions.entries()) {
      const op = isObj(e) ? e.operator : undefined;
      if (!['In', 'NotIn', 'Exists', 'DoesNotExist'].includes(op as string)) {
        return [{ reason: 'FieldValueInvalid', field: `${field}.matchExpressions[${i}].operator`, message: `Invalid value: ${JSON.stringify(op)}: not a valid selector operator` }];
      }
    }
  }
  try {
    parseLabelSelector(selectorString(sel));
    return [];
  } catch (err) {
    return [{ reason: 'FieldValueInvalid', field, message: `Invalid value: ${(err as Error).message}` }];
  }
}
